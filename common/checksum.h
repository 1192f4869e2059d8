/* checksum.h — CRC32C (Castagnoli), the checksum of fragments on the wire and of blobs on
 * disk.
 *
 * dpc_crc32c() uses the SSE4.2 crc32 instruction when the CPU has it (detected once at run
 * time) and a slice-by-8 table implementation otherwise; both give identical results. The
 * value is the standard CRC-32C (iSCSI, RFC 3720): dpc_crc32c(0, "123456789", 9) ==
 * 0xE3069283. It chains: dpc_crc32c(dpc_crc32c(0, a, na), b, nb) is the CRC of a followed
 * by b. All functions are thread-safe. */
#ifndef DPC_CHECKSUM_H
#define DPC_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

/* CRC-32C of p[0, n) continuing from `crc` (0 to start). */
uint32_t dpc_crc32c(uint32_t crc, const void *p, size_t n);

/* The portable slice-by-8 implementation (always available). */
uint32_t dpc_crc32c_sw(uint32_t crc, const void *p, size_t n);

/* 1 if the hardware path is available on this CPU. */
int dpc_crc32c_hw_available(void);

/* The hardware path; only valid when dpc_crc32c_hw_available() (falls back to the software
 * path otherwise, so it is always safe to call). */
uint32_t dpc_crc32c_hw(uint32_t crc, const void *p, size_t n);

#endif
