/* safetensors.c — validated safetensors reader (header parsed with cJSON, data by pread or a
 * caller's ranged reads) and deterministic atomic writer. */
#include "common/safetensors.h"
#include "common/errors.h"
#include "common/fsutil.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host"
#endif

struct st_file {
  char *path;
  int fd;         /* st_open's file, or -1 */
  st_read_fn rd;  /* where the bytes come from: the file, or st_open_source's source */
  void *ctx;
  uint64_t data_start; /* 8 + header length */
  uint64_t data_size;
  int n;
  st_tensor *t;
  cJSON *meta; /* detached __metadata__ object, or NULL */
};

static const struct {
  const char *name;
  size_t size;
} dtypes[ST_NUM_DTYPES] = {
    [ST_BOOL] = {"BOOL", 1}, [ST_U8] = {"U8", 1},   [ST_I8] = {"I8", 1},
    [ST_F8_E5M2] = {"F8_E5M2", 1}, [ST_F8_E4M3] = {"F8_E4M3", 1}, [ST_I16] = {"I16", 2},
    [ST_U16] = {"U16", 2}, [ST_F16] = {"F16", 2}, [ST_BF16] = {"BF16", 2},
    [ST_I32] = {"I32", 4}, [ST_U32] = {"U32", 4}, [ST_F32] = {"F32", 4},
    [ST_I64] = {"I64", 8}, [ST_U64] = {"U64", 8}, [ST_F64] = {"F64", 8},
};

size_t st_dtype_size(st_dtype dt) { return (unsigned)dt < ST_NUM_DTYPES ? dtypes[dt].size : 0; }
const char *st_dtype_name(st_dtype dt) { return (unsigned)dt < ST_NUM_DTYPES ? dtypes[dt].name : "?"; }

int st_dtype_parse(const char *s, st_dtype *out) {
  for (int i = 0; i < ST_NUM_DTYPES; i++)
    if (strcmp(s, dtypes[i].name) == 0) {
      *out = (st_dtype)i;
      return 0;
    }
  return dpc_err(DPC_EFORMAT, "unknown safetensors dtype \"%.32s\"", s);
}

float st_bf16_to_f32(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

float st_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
  if (exp == 0) {
    float v = (float)mant * 0x1p-24f; /* zero or subnormal: exact */
    return sign ? -v : v;
  }
  if (exp == 31) bits = sign | 0x7f800000u | (mant << 13);
  else bits = sign | ((exp + 112u) << 23) | (mant << 13);
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

uint16_t st_f32_to_bf16(float f) {
  uint32_t bits;
  memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return (uint16_t)(bits >> 16);
}

/* ---- reading ---- */

static int fmt_err(const char *path, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fmt_err(const char *path, const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return dpc_err(DPC_EFORMAT, "%s: %s", path, msg);
}

static int pread_full(int fd, void *dst, size_t n, uint64_t off) {
  char *p = dst;
  while (n > 0) {
    size_t chunk = n > (1u << 30) ? (1u << 30) : n;
    ssize_t r = pread(fd, p, chunk, (off_t)off);
    if (r < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (r == 0) return 1; /* short: end of file */
    p += r;
    n -= (size_t)r;
    off += (uint64_t)r;
  }
  return 0;
}

/* st_open's source: the file, by pread. */
static int file_read(void *ctx, uint64_t off, void *dst, size_t n) {
  const st_file *f = ctx;
  int r = pread_full(f->fd, dst, n, off);
  return r < 0 ? dpc_err(DPC_EIO, "read %s: %s", f->path, strerror(-r)) : r;
}

/* A JSON number that is a non-negative integer representable exactly (< 2^53). */
static int json_uint(const cJSON *v, uint64_t *out) {
  if (!cJSON_IsNumber(v)) return -1;
  double d = v->valuedouble;
  if (!isfinite(d) || d < 0 || d != floor(d) || d >= 9007199254740992.0) return -1;
  *out = (uint64_t)d;
  return 0;
}

static int cmp_by_offset(const void *a, const void *b) {
  const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return 0;
}

static int cmp_by_name(const void *a, const void *b) {
  return strcmp((*(const st_tensor *const *)a)->name, (*(const st_tensor *const *)b)->name);
}

static int parse_tensor(const char *path, const cJSON *item, st_tensor *t) {
  const char *name = item->string;
  if (!cJSON_IsObject(item)) return fmt_err(path, "tensor \"%.200s\": entry is not a JSON object", name);
  const cJSON *dt = cJSON_GetObjectItemCaseSensitive(item, "dtype");
  const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
  const cJSON *offs = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
  if (!cJSON_IsString(dt)) return fmt_err(path, "tensor \"%.200s\": missing or non-string \"dtype\"", name);
  if (st_dtype_parse(dt->valuestring, &t->dtype))
    return fmt_err(path, "tensor \"%.200s\": unknown dtype \"%.32s\"", name, dt->valuestring);
  if (!cJSON_IsArray(shape)) return fmt_err(path, "tensor \"%.200s\": missing or non-array \"shape\"", name);
  int nd = cJSON_GetArraySize(shape);
  if (nd > ST_MAX_DIMS) return fmt_err(path, "tensor \"%.200s\": %d dimensions (at most %d)", name, nd, ST_MAX_DIMS);
  t->ndim = nd;
  uint64_t numel = 1;
  int k = 0;
  const cJSON *d;
  cJSON_ArrayForEach(d, shape) {
    uint64_t v;
    if (json_uint(d, &v) || v > INT64_MAX)
      return fmt_err(path, "tensor \"%.200s\": shape[%d] is not a non-negative integer", name, k);
    t->shape[k++] = (int64_t)v;
    if (__builtin_mul_overflow(numel, v, &numel))
      return fmt_err(path, "tensor \"%.200s\": element count overflows", name);
  }
  t->numel = numel;
  uint64_t bytes;
  if (__builtin_mul_overflow(numel, (uint64_t)st_dtype_size(t->dtype), &bytes))
    return fmt_err(path, "tensor \"%.200s\": byte size overflows", name);
  if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 || json_uint(offs->child, &t->begin) ||
      json_uint(offs->child->next, &t->end))
    return fmt_err(path, "tensor \"%.200s\": \"data_offsets\" must be [begin, end] non-negative integers", name);
  if (t->end < t->begin)
    return fmt_err(path, "tensor \"%.200s\": data_offsets [%llu, %llu] end before begin", name,
                   (unsigned long long)t->begin, (unsigned long long)t->end);
  if (t->end - t->begin != bytes)
    return fmt_err(path, "tensor \"%.200s\": data_offsets span %llu bytes but %s shape needs %llu", name,
                   (unsigned long long)(t->end - t->begin), dtypes[t->dtype].name, (unsigned long long)bytes);
  return 0;
}

/* Parse and validate the header text hdr[0, hlen) (NUL-terminated) into f. */
static int parse_header(st_file *f, const char *hdr, size_t hlen) {
  const char *path = f->path;
  if (hlen == 0 || hdr[0] != '{') return fmt_err(path, "header does not start with '{'");
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(hdr, hlen, &end, 0);
  if (!root) return fmt_err(path, "header (%zu bytes) is not valid JSON", hlen);
  int rc = 0;
  for (const char *p = end; p && p < hdr + hlen; p++)
    if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
      rc = fmt_err(path, "header has trailing bytes after the JSON object");
      goto out;
    }
  if (!cJSON_IsObject(root)) {
    rc = fmt_err(path, "header is not a JSON object");
    goto out;
  }
  int count = cJSON_GetArraySize(root);
  f->t = calloc((size_t)count + 1, sizeof *f->t);
  st_tensor **order = calloc((size_t)count + 1, sizeof *order);
  if (!f->t || !order) {
    free(order);
    rc = dpc_err(DPC_ENOMEM, "%s: out of memory for %d tensors", path, count);
    goto out;
  }
  cJSON *item = root->child;
  while (item && !rc) {
    cJSON *next = item->next;
    if (!item->string || !*item->string) {
      rc = fmt_err(path, "header has an empty tensor name");
    } else if (strcmp(item->string, "__metadata__") == 0) {
      if (f->meta) {
        rc = fmt_err(path, "header has two \"__metadata__\" entries");
      } else if (!cJSON_IsObject(item)) {
        rc = fmt_err(path, "\"__metadata__\" is not a JSON object");
      } else {
        const cJSON *kv;
        cJSON_ArrayForEach(kv, item) if (!cJSON_IsString(kv)) {
          rc = fmt_err(path, "\"__metadata__\" value for \"%.100s\" is not a string", kv->string ? kv->string : "");
          break;
        }
        if (!rc) f->meta = cJSON_DetachItemViaPointer(root, item);
      }
    } else {
      st_tensor *t = &f->t[f->n];
      rc = parse_tensor(path, item, t);
      if (!rc) {
        t->name = strdup(item->string);
        if (!t->name) rc = dpc_err(DPC_ENOMEM, "%s: out of memory", path);
        else order[f->n] = t, f->n++;
      }
    }
    item = next;
  }
  if (!rc && f->n > 1) {
    qsort(order, (size_t)f->n, sizeof *order, cmp_by_name);
    for (int i = 1; i < f->n && !rc; i++)
      if (strcmp(order[i - 1]->name, order[i]->name) == 0)
        rc = fmt_err(path, "tensor \"%.200s\" appears twice in the header", order[i]->name);
  }
  if (!rc) {
    /* The tensors must tile the data section: sorted by offset, each starts where the
     * previous ended, and the last ends at the end of the file. */
    qsort(order, (size_t)f->n, sizeof *order, cmp_by_offset);
    uint64_t expect = 0;
    for (int i = 0; i < f->n && !rc; i++) {
      const st_tensor *t = order[i];
      if (t->begin < expect)
        rc = fmt_err(path, "tensor \"%.200s\" data_offsets [%llu, %llu] overlap the previous tensor (ends at %llu)",
                     t->name, (unsigned long long)t->begin, (unsigned long long)t->end, (unsigned long long)expect);
      else if (t->begin > expect)
        rc = fmt_err(path, "hole in the data section before tensor \"%.200s\" (bytes %llu..%llu unused)", t->name,
                     (unsigned long long)expect, (unsigned long long)t->begin);
      else if (t->end > f->data_size)
        rc = fmt_err(path, "tensor \"%.200s\" data_offsets [%llu, %llu] reach past the data section (%llu bytes; file truncated?)",
                     t->name, (unsigned long long)t->begin, (unsigned long long)t->end, (unsigned long long)f->data_size);
      expect = t->end;
    }
    if (!rc && expect != f->data_size)
      rc = fmt_err(path, "data section is %llu bytes but the tensors cover %llu (trailing bytes)",
                   (unsigned long long)f->data_size, (unsigned long long)expect);
  }
  free(order);
out:
  cJSON_Delete(root);
  return rc;
}

void st_close(st_file *f) {
  if (!f) return;
  if (f->fd >= 0) close(f->fd);
  for (int i = 0; i < f->n; i++) free(f->t[i].name);
  free(f->t);
  cJSON_Delete(f->meta);
  free(f->path);
  free(f);
}

/* The header of a file or source of `size` bytes whose reader f->rd is set: validated, parsed. */
static int open_header(st_file *f, uint64_t size) {
  const char *path = f->path;
  int rc = 0;
  char *hdr = NULL;
  unsigned char lenbuf[8];
  if (size < 8)
    return fmt_err(path, "truncated: %llu bytes, too short for the 8-byte header length", (unsigned long long)size);
  int r = f->rd(f->ctx, 0, lenbuf, 8);
  if (r) return r < 0 ? r : fmt_err(path, "truncated while reading");
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | lenbuf[i];
  if (hlen > ST_MAX_HEADER)
    return fmt_err(path, "header length %llu exceeds the %u-byte limit (not a safetensors file?)",
                   (unsigned long long)hlen, ST_MAX_HEADER);
  if (hlen > size - 8)
    return fmt_err(path, "header length %llu exceeds the file size %llu (truncated or not safetensors)",
                   (unsigned long long)hlen, (unsigned long long)size);
  f->data_start = 8 + hlen;
  f->data_size = size - f->data_start;
  hdr = malloc(hlen + 1);
  if (!hdr) return dpc_err(DPC_ENOMEM, "%s: cannot allocate %llu-byte header", path, (unsigned long long)hlen);
  r = f->rd(f->ctx, 8, hdr, hlen);
  if (r) {
    rc = r < 0 ? r : fmt_err(path, "truncated while reading header");
  } else {
    hdr[hlen] = '\0';
    rc = memchr(hdr, '\0', hlen) ? fmt_err(path, "header contains a NUL byte") : parse_header(f, hdr, hlen);
  }
  free(hdr);
  return rc;
}

static st_file *new_file(const char *path) {
  st_file *f = calloc(1, sizeof *f);
  if (!f || !(f->path = strdup(path))) {
    free(f);
    dpc_err(DPC_ENOMEM, "%s: out of memory", path);
    return NULL;
  }
  f->fd = -1;
  return f;
}

int st_open(const char *path, st_file **out) {
  *out = NULL;
  st_file *f = new_file(path);
  if (!f) return DPC_ENOMEM;
  f->rd = file_read;
  f->ctx = f;
  f->fd = open(path, O_RDONLY | O_CLOEXEC);
  if (f->fd < 0) {
    int e = errno;
    st_close(f);
    return dpc_err(dpc_errno_code(e), "open %s: %s", path, strerror(e));
  }
  struct stat st;
  int rc = fstat(f->fd, &st) != 0 || !S_ISREG(st.st_mode) ? dpc_err(DPC_EIO, "%s: not a readable regular file", path)
                                                          : open_header(f, (uint64_t)st.st_size);
  if (rc) {
    st_close(f);
    return rc;
  }
  *out = f;
  return 0;
}

int st_open_source(const char *label, uint64_t size, st_read_fn rd, void *ctx, st_file **out) {
  *out = NULL;
  st_file *f = new_file(label);
  if (!f) return DPC_ENOMEM;
  f->rd = rd;
  f->ctx = ctx;
  int rc = open_header(f, size);
  if (rc) {
    st_close(f);
    return rc;
  }
  *out = f;
  return 0;
}

const char *st_path(const st_file *f) { return f->path; }
int st_num_tensors(const st_file *f) { return f->n; }
const st_tensor *st_get(const st_file *f, int i) { return i >= 0 && i < f->n ? &f->t[i] : NULL; }

int st_find(const st_file *f, const char *name) {
  for (int i = 0; i < f->n; i++)
    if (strcmp(f->t[i].name, name) == 0) return i;
  return -1;
}

const char *st_metadata(const st_file *f, const char *key) {
  if (!f->meta) return NULL;
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(f->meta, key);
  return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int read_at(const st_file *f, const st_tensor *t, void *dst, size_t n, uint64_t off) {
  int r = f->rd(f->ctx, f->data_start + off, dst, n);
  if (r < 0) {
    char why[512];
    snprintf(why, sizeof why, "%s", dpc_errmsg());
    return dpc_err(r, "tensor \"%.200s\": %s", t->name, why);
  }
  if (r > 0) return fmt_err(f->path, "file ends inside tensor \"%.200s\" (truncated after opening?)", t->name);
  return 0;
}

int st_read_raw(const st_file *f, int i, void *dst) {
  if (i < 0 || i >= f->n) return dpc_err(DPC_EINVAL, "%s: tensor index %d out of range", f->path, i);
  const st_tensor *t = &f->t[i];
  return read_at(f, t, dst, (size_t)(t->end - t->begin), t->begin);
}

int st_read_f32(const st_file *f, int i, uint64_t start, uint64_t n, float *dst) {
  if (i < 0 || i >= f->n) return dpc_err(DPC_EINVAL, "%s: tensor index %d out of range", f->path, i);
  const st_tensor *t = &f->t[i];
  if (start > t->numel || n > t->numel - start)
    return dpc_err(DPC_EINVAL, "%s: tensor \"%.200s\": range [%llu, +%llu) outside %llu elements", f->path,
                   t->name, (unsigned long long)start, (unsigned long long)n, (unsigned long long)t->numel);
  if (t->dtype == ST_F32) return read_at(f, t, dst, (size_t)n * 4, t->begin + start * 4);
  if (t->dtype != ST_BF16 && t->dtype != ST_F16)
    return dpc_err(DPC_EUNSUPPORTED, "%s: tensor \"%.200s\" has dtype %s; only F32, BF16 and F16 can be read as float",
                   f->path, t->name, dtypes[t->dtype].name);
  /* One read for the whole range (a remote source pays per request): the 16-bit values go to
   * the upper half of dst and are widened in place from the front, each float ending where the
   * next value not yet read starts. */
  unsigned char *h = (unsigned char *)(dst + n) - (size_t)n * 2;
  int rc = read_at(f, t, h, (size_t)n * 2, t->begin + start * 2);
  if (rc) return rc;
  for (uint64_t k = 0; k < n; k++) {
    uint16_t v;
    memcpy(&v, h + 2 * k, 2);
    dst[k] = t->dtype == ST_BF16 ? st_bf16_to_f32(v) : st_f16_to_f32(v);
  }
  return 0;
}

/* ---- writing ---- */

typedef struct {
  char *p;
  size_t len, cap;
  int oom;
} strbuf;

static void sb_put(strbuf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->len + n + 1 > b->cap) {
    size_t nc = b->cap ? b->cap : 1024;
    while (nc < b->len + n + 1) nc *= 2;
    char *np = realloc(b->p, nc);
    if (!np) {
      b->oom = 1;
      return;
    }
    b->p = np;
    b->cap = nc;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}

static void sb_puts(strbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_printf(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(strbuf *b, const char *fmt, ...) {
  char tmp[128];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  sb_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

static void sb_json_string(strbuf *b, const char *s) {
  sb_puts(b, "\"");
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') {
      char e[2] = {'\\', (char)c};
      sb_put(b, e, 2);
    } else if (c < 0x20) {
      sb_printf(b, "\\u%04x", c);
    } else {
      sb_put(b, (const char *)&c, 1);
    }
  }
  sb_puts(b, "\"");
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

int st_write(const char *path, const st_write_tensor *t, int n, const char *const *meta, int n_meta) {
  if (n < 0 || n_meta < 0 || (n > 0 && !t) || (n_meta > 0 && !meta))
    return dpc_err(DPC_EINVAL, "write %s: bad tensor or metadata count", path);
  const char **names = calloc((size_t)n + 1, sizeof *names);
  uint64_t *bytes = calloc((size_t)n + 1, sizeof *bytes);
  strbuf h = {0};
  int rc = 0;
  if (!names || !bytes) {
    rc = dpc_err(DPC_ENOMEM, "write %s: out of memory", path);
    goto out;
  }
  for (int i = 0; i < n && !rc; i++) {
    if (!t[i].name || !*t[i].name || strcmp(t[i].name, "__metadata__") == 0)
      rc = dpc_err(DPC_EINVAL, "write %s: tensor %d has an invalid name", path, i);
    else if ((unsigned)t[i].dtype >= ST_NUM_DTYPES || t[i].ndim < 0 || t[i].ndim > ST_MAX_DIMS)
      rc = dpc_err(DPC_EINVAL, "write %s: tensor \"%s\" has a bad dtype or rank", path, t[i].name);
    uint64_t numel = 1;
    for (int d = 0; d < t[i].ndim && !rc; d++)
      if (t[i].shape[d] < 0 || __builtin_mul_overflow(numel, (uint64_t)t[i].shape[d], &numel))
        rc = dpc_err(DPC_EINVAL, "write %s: tensor \"%s\" has a bad shape", path, t[i].name);
    if (!rc && __builtin_mul_overflow(numel, (uint64_t)st_dtype_size(t[i].dtype), &bytes[i]))
      rc = dpc_err(DPC_EINVAL, "write %s: tensor \"%s\" is too large", path, t[i].name);
    if (!rc && bytes[i] && !t[i].data) rc = dpc_err(DPC_EINVAL, "write %s: tensor \"%s\" has no data", path, t[i].name);
    names[i] = t[i].name;
  }
  if (rc) goto out;
  qsort(names, (size_t)n, sizeof *names, cmp_str);
  for (int i = 1; i < n; i++)
    if (strcmp(names[i - 1], names[i]) == 0) {
      rc = dpc_err(DPC_EINVAL, "write %s: tensor name \"%s\" used twice", path, names[i]);
      goto out;
    }

  sb_puts(&h, "{");
  if (n_meta > 0) {
    sb_puts(&h, "\"__metadata__\":{");
    for (int k = 0; k < n_meta; k++) {
      if (!meta[2 * k] || !meta[2 * k + 1]) {
        rc = dpc_err(DPC_EINVAL, "write %s: metadata pair %d has a NULL key or value", path, k);
        goto out;
      }
      if (k) sb_puts(&h, ",");
      sb_json_string(&h, meta[2 * k]);
      sb_puts(&h, ":");
      sb_json_string(&h, meta[2 * k + 1]);
    }
    sb_puts(&h, "}");
  }
  uint64_t off = 0;
  for (int i = 0; i < n; i++) {
    if (i || n_meta > 0) sb_puts(&h, ",");
    sb_json_string(&h, t[i].name);
    sb_printf(&h, ":{\"dtype\":\"%s\",\"shape\":[", dtypes[t[i].dtype].name);
    for (int d = 0; d < t[i].ndim; d++) sb_printf(&h, d ? ",%lld" : "%lld", (long long)t[i].shape[d]);
    sb_printf(&h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off, (unsigned long long)(off + bytes[i]));
    off += bytes[i];
  }
  sb_puts(&h, "}");
  while (!h.oom && h.len % 8) sb_puts(&h, " "); /* the data section starts 8-byte aligned */
  if (h.oom) {
    rc = dpc_err(DPC_ENOMEM, "write %s: out of memory for the header", path);
    goto out;
  }
  if (h.len > ST_MAX_HEADER) {
    rc = dpc_err(DPC_ERANGE, "write %s: header of %zu bytes exceeds the limit", path, h.len);
    goto out;
  }
  unsigned char lenbuf[8];
  for (int i = 0; i < 8; i++) lenbuf[i] = (unsigned char)((uint64_t)h.len >> (8 * i));
  dpc_afile *af;
  rc = dpc_afile_open(path, &af);
  if (rc) goto out;
  rc = dpc_afile_write(af, lenbuf, 8);
  if (!rc) rc = dpc_afile_write(af, h.p, h.len);
  for (int i = 0; i < n && !rc; i++) rc = dpc_afile_write(af, t[i].data, (size_t)bytes[i]);
  if (rc) dpc_afile_abort(af);
  else rc = dpc_afile_commit(af);
out:
  free(h.p);
  free(names);
  free(bytes);
  return rc;
}
