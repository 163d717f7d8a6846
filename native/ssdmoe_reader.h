/* ssdmoe native expert reader: batched positional reads into caller-owned memory.
 *
 * One handle owns a persistent pool of queue_depth - 1 worker threads; the calling
 * thread is the queue_depth-th reader, so queue_depth 1 means no threads at all.
 * Calls on one handle are serialized (a mutex), so several Python threads may share it.
 */
#ifndef SSDMOE_READER_H
#define SSDMOE_READER_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever a signature or a status code changes; reader.py checks it. */
#define SSDMOE_ABI_VERSION 2

/* A short read (the file ended first) is reported as -(SSDMOE_SHORT_READ_BASE + got),
 * where got is how many bytes were read; errno failures are -errno (errno < 4096). */
#define SSDMOE_SHORT_READ_BASE ((int64_t)1 << 40)

typedef struct ssdmoe_reader ssdmoe_reader;

int ssdmoe_abi_version(void);

/* direct != 0: files opened with direct < 0 bypass the page cache (Linux O_DIRECT with
 * aligned bounce buffers, macOS F_NOCACHE). Returns NULL only on allocation failure. */
ssdmoe_reader *ssdmoe_reader_create(int queue_depth, int direct);
/* Stops the workers and closes every fd opened with ssdmoe_open. */
void ssdmoe_reader_destroy(ssdmoe_reader *r);
int ssdmoe_reader_queue_depth(const ssdmoe_reader *r);

/* Opens path read-only; returns an fd for ssdmoe_read_batch or -errno.
 * direct: 1 yes, 0 no, -1 the handle's default. When direct I/O is refused (e.g. the
 * filesystem rejects O_DIRECT) the fd still works, buffered; see ssdmoe_fd_is_direct. */
int ssdmoe_open(ssdmoe_reader *r, const char *path, int direct);
/* 1 when reads on fd currently bypass the page cache, 0 otherwise. */
int ssdmoe_fd_is_direct(ssdmoe_reader *r, int fd);
/* errno of the last refused direct open (0 if none). */
int ssdmoe_direct_open_errno(ssdmoe_reader *r);
/* How many requests fell back to buffered reads because a direct read got EINVAL. */
int64_t ssdmoe_direct_fallbacks(ssdmoe_reader *r);
/* Closes an fd from ssdmoe_open (and its O_DIRECT twin). Returns 0 or -errno. */
int ssdmoe_close(ssdmoe_reader *r, int fd);

/* Reads lengths[i] bytes at offsets[i] of fds[i] into dests[i], for i < n, in parallel.
 * status_out[i] = lengths[i] on success, -errno, or a short-read code (see above).
 * Zero-length requests succeed. Any fd works (not only ssdmoe_open ones); those not
 * from ssdmoe_open are read buffered. Returns how many requests failed (0 = all good),
 * or -EINVAL for bad arguments. */
int ssdmoe_read_batch(ssdmoe_reader *r, int n, const int *fds, const int64_t *offsets,
                      const int64_t *lengths, void *const *dests, int64_t *status_out);

/* What a request of ssdmoe_read_batch_kinds does with its bytes. */
enum {
    SSDMOE_COPY = 0,       /* lengths[i] bytes land in dests[i] as they are */
    SSDMOE_WIDEN_BF16 = 1, /* lengths[i] bytes of bfloat16 -> float32 at dests[i] */
    SSDMOE_WIDEN_F16 = 2   /* lengths[i] bytes of IEEE half -> float32 at dests[i] */
};

/* ssdmoe_read_batch with a kind per request (kinds NULL: all SSDMOE_COPY). A widening
 * request reads lengths[i] bytes (an even count, else -EINVAL) of little-endian 16-bit
 * floats through the reading thread's own buffer and writes each as a float32, so
 * dests[i] receives 2 * lengths[i] bytes; status_out[i] counts the bytes read. The
 * widening is exact and bit for bit numpy's astype(float32): bf16 is the top half of a
 * float32; f16 keeps subnormals, infinities, signed zeros and NaN payloads. Done in the
 * reading threads so the caller's thread spends nothing on it. */
int ssdmoe_read_batch_kinds(ssdmoe_reader *r, int n, const int *fds, const int64_t *offsets,
                            const int64_t *lengths, void *const *dests, const int *kinds,
                            int64_t *status_out);

#ifdef __cplusplus
}
#endif

#endif
