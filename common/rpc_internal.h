/* rpc_internal.h — pieces shared by the rpc_*.c files and nothing else: credentials (the one
 * place where they are made), channel/server argument sets and timing helpers. */
#ifndef DPC_RPC_INTERNAL_H
#define DPC_RPC_INTERNAL_H

#include "common/rpc.h"

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>

/* Credentials for a server port / a channel. tls == NULL gives insecure credentials;
 * otherwise TLS / mutual TLS as described at struct rpc_tls. On success the caller owns *out and releases it
 * with grpc_server_credentials_release / grpc_channel_credentials_release. */
int rpc_creds_server(const struct rpc_tls *tls, grpc_server_credentials **out);
int rpc_creds_channel(const struct rpc_tls *tls, grpc_channel_credentials **out);

/* Channel arguments common to both peers: message size limits both ways, SO_REUSEPORT off
 * (gRPC turns it on by default, so a second coordinator would silently bind the same port)
 * and, on request, a private subchannel pool (channels with identical arguments otherwise
 * share one TCP connection). */
struct rpc_args {
  grpc_arg arg[4];
  grpc_channel_args set;
};
void rpc_args_init(struct rpc_args *a, size_t max_msg_bytes, int own_connection);

/* An absolute deadline timeout_ms from now (infinite for timeout_ms ≤ 0). */
gpr_timespec rpc_deadline(int timeout_ms);

#endif
