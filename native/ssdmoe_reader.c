/* ssdmoe native expert reader: see ssdmoe_reader.h for the contract.
 *
 * Built by the package build (setup.py: an extension module that reader.py loads with
 * ctypes) with the flags in cflags.txt; `make sanitize` builds it with ASan + UBSan.
 *
 * Why native: the engine reads thousands of expert slices per token; a pool of threads
 * doing pread straight into MLX buffers keeps the SSD queue full without the GIL or any
 * per-request Python objects.
 */
#ifdef __linux__
#define _GNU_SOURCE /* O_DIRECT */
#endif

#include "ssdmoe_reader.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define SSDMOE_ALIGN ((int64_t)4096)
#define SSDMOE_BOUNCE_MAX ((int64_t)8 << 20) /* per-thread bounce buffer cap */
#define SSDMOE_MAX_CHUNK ((int64_t)1 << 30)  /* pread size cap (macOS rejects > INT_MAX) */
#define SSDMOE_MAX_QUEUE 1024
#define SSDMOE_WIDEN_CHUNK ((int64_t)64 << 10) /* 16-bit floats read per pass: stays in L2 */

enum { MODE_BUFFERED = 0, MODE_ODIRECT = 1, MODE_NOCACHE = 2 };

typedef struct {
    int registered; /* opened by ssdmoe_open: closed by destroy */
    int mode;       /* MODE_*; read atomically, demoted to buffered on EINVAL */
    int dfd;        /* O_DIRECT twin, or -1 */
} fd_entry;

typedef struct {
    int n;
    const int *fds;
    const int64_t *offsets;
    const int64_t *lengths;
    void *const *dests;
    const int *kinds; /* NULL: every request a plain copy */
    int64_t *status;
    int64_t next; /* next request index; claimed with an atomic fetch-add */
} batch_t;

struct ssdmoe_reader;

typedef struct {
    pthread_t thread;
    struct ssdmoe_reader *r;
    void *bounce; /* 4096-aligned, for O_DIRECT reads of unaligned ranges */
    size_t bounce_size;
    void *raw; /* 4096-aligned, SSDMOE_WIDEN_CHUNK bytes: 16-bit floats before widening */
} worker_t;

struct ssdmoe_reader {
    int queue_depth;
    int direct_default;
    int nworkers;
    pthread_mutex_t call_lock; /* serializes read_batch / open / close */
    pthread_mutex_t lock;      /* guards the fields below */
    pthread_cond_t work_cv;
    pthread_cond_t done_cv;
    uint64_t gen;
    int batch_open;
    int active;
    int shutdown;
    batch_t batch;
    worker_t *workers;
    worker_t caller; /* the calling thread's bounce buffer */
    fd_entry *fdtab;
    int fdcap;
    int direct_open_errno;
    int64_t direct_fallbacks;
};

int ssdmoe_abi_version(void) { return SSDMOE_ABI_VERSION; }

static int64_t short_code(int64_t got) { return -(SSDMOE_SHORT_READ_BASE + got); }

/* pread until len bytes or EOF; EINTR is retried. `block`: the unit every read returns a
 * multiple of until EOF (4096 for an aligned O_DIRECT read, 1 for a buffered one), so a
 * read of fewer bytes than a whole block also means EOF. */
static int64_t read_full(int fd, char *dst, int64_t off, int64_t len, int64_t block) {
    int64_t done = 0;
    while (done < len) {
        int64_t chunk = len - done;
        if (chunk > SSDMOE_MAX_CHUNK) chunk = SSDMOE_MAX_CHUNK;
        ssize_t got = pread(fd, dst + done, (size_t)chunk, (off_t)(off + done));
        if (got < 0) {
            if (errno == EINTR) continue;
            return -(int64_t)errno;
        }
        done += got;
        if (got == 0 || got % block != 0) break; /* end of file */
    }
    return done >= len ? len : short_code(done);
}

#ifdef __linux__
static int ensure_bounce(worker_t *w, int64_t want) {
    if (want > SSDMOE_BOUNCE_MAX) want = SSDMOE_BOUNCE_MAX;
    if (w->bounce && (int64_t)w->bounce_size >= want) return 0;
    void *p = NULL;
    if (posix_memalign(&p, (size_t)SSDMOE_ALIGN, (size_t)want) != 0) return -ENOMEM;
    free(w->bounce);
    w->bounce = p;
    w->bounce_size = (size_t)want;
    return 0;
}

/* O_DIRECT read of an arbitrary range: widen to 4096-aligned blocks, read them into the
 * bounce buffer (or straight into dst when everything is aligned), copy the wanted part.
 * Returns bytes, -errno or a short code; -EINVAL tells the caller to fall back. */
static int64_t read_direct(worker_t *w, int dfd, char *dst, int64_t off, int64_t len) {
    const int64_t end = off + len;
    if (((uintptr_t)dst % SSDMOE_ALIGN) == 0 && off % SSDMOE_ALIGN == 0 &&
        len % SSDMOE_ALIGN == 0) {
        return read_full(dfd, dst, off, len, SSDMOE_ALIGN); /* straight into dst */
    }
    int64_t pos = off - off % SSDMOE_ALIGN;
    const int64_t stop = ((end + SSDMOE_ALIGN - 1) / SSDMOE_ALIGN) * SSDMOE_ALIGN;
    int rc = ensure_bounce(w, stop - pos);
    if (rc) return rc;
    int64_t done = 0;
    while (done < len) {
        int64_t chunk = stop - pos;
        if (chunk > (int64_t)w->bounce_size) chunk = (int64_t)w->bounce_size;
        ssize_t got = pread(dfd, w->bounce, (size_t)chunk, (off_t)pos);
        if (got < 0) {
            if (errno == EINTR) continue;
            return -(int64_t)errno;
        }
        int64_t from = off + done; /* >= pos */
        int64_t upto = pos + got < end ? pos + got : end;
        if (upto > from) {
            memcpy(dst + done, (char *)w->bounce + (from - pos), (size_t)(upto - from));
            done += upto - from;
        }
        if (got == 0 || got % SSDMOE_ALIGN != 0) break; /* end of file */
        pos += got;
    }
    return done >= len ? len : short_code(done);
}
#endif

static int64_t read_one(struct ssdmoe_reader *r, worker_t *w, int fd, int64_t off,
                        int64_t len, void *dest) {
    if (off < 0 || len < 0) return -EINVAL;
    if (len == 0) return 0;
    if (!dest) return -EFAULT;
    /* Range check before any arithmetic: off + len, and the end rounded up to the next
     * 4096 block (O_DIRECT), must both fit in int64 (signed overflow is undefined). */
    if (off > INT64_MAX - SSDMOE_ALIGN - len) return -EOVERFLOW;
#ifdef __linux__
    if (fd >= 0 && fd < r->fdcap) {
        fd_entry *e = &r->fdtab[fd];
        if (__atomic_load_n(&e->mode, __ATOMIC_RELAXED) == MODE_ODIRECT) {
            int64_t got = read_direct(w, e->dfd, (char *)dest, off, len);
            if (got != -EINVAL) return got;
            /* The filesystem accepted O_DIRECT at open but refuses these reads. */
            __atomic_store_n(&e->mode, MODE_BUFFERED, __ATOMIC_RELAXED);
            __atomic_fetch_add(&r->direct_fallbacks, 1, __ATOMIC_RELAXED);
        }
    }
#else
    (void)r;
    (void)w;
#endif
    return read_full(fd, (char *)dest, off, len, 1); /* buffered */
}

/* IEEE half -> float32 bits, numpy's npy_halfbits_to_floatbits: exact, NaN payloads
 * kept (no quieting), subnormal halves normalized. */
static uint32_t half_to_float_bits(uint16_t h) {
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
    uint32_t exp = h & 0x7c00u;
    uint32_t sig = h & 0x03ffu;
    if (exp == 0x7c00u) return sign | 0x7f800000u | (sig << 13); /* inf, NaN */
    if (exp != 0) return sign + ((((uint32_t)h & 0x7fffu) + 0x1c000u) << 13);
    if (sig == 0) return sign; /* signed zero */
    uint32_t shift = 0;        /* subnormal: normalize */
    sig <<= 1;
    while ((sig & 0x0400u) == 0) {
        sig <<= 1;
        shift++;
    }
    return sign + ((127u - 15u - shift) << 23) + ((sig & 0x03ffu) << 13);
}

/* bf16 in blocks of 16 (a fixed count the compiler vectorizes at -O2; a loop of unknown
 * count it leaves scalar there: 9.1 against 3.0 us per 64 KiB on the dev VM), then the tail. */
static void widen(const uint16_t *restrict src, uint32_t *restrict dst, int64_t count,
                  int kind) {
    int64_t i = 0;
    if (kind == SSDMOE_WIDEN_BF16) {
        for (; i + 16 <= count; i += 16)
            for (int j = 0; j < 16; j++) dst[i + j] = (uint32_t)src[i + j] << 16;
        for (; i < count; i++) dst[i] = (uint32_t)src[i] << 16;
    } else {
        for (; i < count; i++) dst[i] = half_to_float_bits(src[i]);
    }
}

/* Reads len bytes of 16-bit floats at off, chunk by chunk into the thread's raw buffer,
 * and writes them widened to float32 at dest. Returns len, -errno or a short code (the
 * bytes of the file read before it ended, as for a copy). */
static int64_t read_widened(struct ssdmoe_reader *r, worker_t *w, int fd, int64_t off,
                            int64_t len, void *dest, int kind) {
    if (kind != SSDMOE_WIDEN_BF16 && kind != SSDMOE_WIDEN_F16) return -EINVAL;
    if (len % 2 != 0 || ((uintptr_t)dest % 4) != 0) return -EINVAL;
    if (len == 0) return 0;
    if (!dest) return -EFAULT;
    if (!w->raw) {
        void *p = NULL;
        if (posix_memalign(&p, (size_t)SSDMOE_ALIGN, (size_t)SSDMOE_WIDEN_CHUNK) != 0)
            return -ENOMEM;
        w->raw = p;
    }
    int64_t done = 0;
    while (done < len) {
        int64_t chunk = len - done < SSDMOE_WIDEN_CHUNK ? len - done : SSDMOE_WIDEN_CHUNK;
        int64_t got = read_one(r, w, fd, off + done, chunk, w->raw);
        if (got <= -SSDMOE_SHORT_READ_BASE) return short_code(done - got - SSDMOE_SHORT_READ_BASE);
        if (got < 0) return got;
        widen((const uint16_t *)w->raw, (uint32_t *)dest + done / 2, chunk / 2, kind);
        done += chunk;
    }
    return len;
}

static void run_batch(struct ssdmoe_reader *r, worker_t *w) {
    batch_t *b = &r->batch;
    for (;;) {
        int64_t i = __atomic_fetch_add(&b->next, 1, __ATOMIC_RELAXED);
        if (i >= b->n) break;
        int kind = b->kinds ? b->kinds[i] : SSDMOE_COPY;
        b->status[i] =
            kind == SSDMOE_COPY
                ? read_one(r, w, b->fds[i], b->offsets[i], b->lengths[i], b->dests[i])
                : read_widened(r, w, b->fds[i], b->offsets[i], b->lengths[i], b->dests[i], kind);
    }
}

static void *worker_main(void *arg) {
    worker_t *w = (worker_t *)arg;
    struct ssdmoe_reader *r = w->r;
    uint64_t seen = 0;
    /* Named, so profilers and /proc/<pid>/task/<tid>/comm tell the reader's CPU apart. */
#if defined(__linux__)
    pthread_setname_np(pthread_self(), "ssdmoe-read");
#elif defined(__APPLE__)
    pthread_setname_np("ssdmoe-read");
#endif
    pthread_mutex_lock(&r->lock);
    for (;;) {
        while (!r->shutdown && !(r->batch_open && r->gen != seen))
            pthread_cond_wait(&r->work_cv, &r->lock);
        if (r->shutdown) break;
        seen = r->gen;
        r->active++;
        pthread_mutex_unlock(&r->lock);
        run_batch(r, w);
        pthread_mutex_lock(&r->lock);
        if (--r->active == 0) pthread_cond_signal(&r->done_cv);
    }
    pthread_mutex_unlock(&r->lock);
    return NULL;
}

ssdmoe_reader *ssdmoe_reader_create(int queue_depth, int direct) {
    if (queue_depth < 1) queue_depth = 1;
    if (queue_depth > SSDMOE_MAX_QUEUE) queue_depth = SSDMOE_MAX_QUEUE;
    struct ssdmoe_reader *r = (struct ssdmoe_reader *)calloc(1, sizeof(*r));
    if (!r) return NULL;
    r->direct_default = direct ? 1 : 0;
    pthread_mutex_init(&r->call_lock, NULL);
    pthread_mutex_init(&r->lock, NULL);
    pthread_cond_init(&r->work_cv, NULL);
    pthread_cond_init(&r->done_cv, NULL);
    r->caller.r = r;
    int want = queue_depth - 1;
    if (want > 0) {
        r->workers = (worker_t *)calloc((size_t)want, sizeof(worker_t));
        if (!r->workers) want = 0;
    }
    for (int i = 0; i < want; i++) {
        r->workers[i].r = r;
        if (pthread_create(&r->workers[i].thread, NULL, worker_main, &r->workers[i]) != 0)
            break; /* run with the threads we got */
        r->nworkers++;
    }
    r->queue_depth = r->nworkers + 1;
    return r;
}

int ssdmoe_reader_queue_depth(const ssdmoe_reader *r) { return r ? r->queue_depth : 0; }

void ssdmoe_reader_destroy(ssdmoe_reader *r) {
    if (!r) return;
    pthread_mutex_lock(&r->lock);
    r->shutdown = 1;
    pthread_cond_broadcast(&r->work_cv);
    pthread_mutex_unlock(&r->lock);
    for (int i = 0; i < r->nworkers; i++) {
        pthread_join(r->workers[i].thread, NULL);
        free(r->workers[i].bounce);
        free(r->workers[i].raw);
    }
    free(r->workers);
    free(r->caller.bounce);
    free(r->caller.raw);
    for (int fd = 0; fd < r->fdcap; fd++) {
        if (!r->fdtab[fd].registered) continue;
        if (r->fdtab[fd].dfd >= 0) close(r->fdtab[fd].dfd);
        close(fd);
    }
    free(r->fdtab);
    pthread_cond_destroy(&r->work_cv);
    pthread_cond_destroy(&r->done_cv);
    pthread_mutex_destroy(&r->lock);
    pthread_mutex_destroy(&r->call_lock);
    free(r);
}

static int grow_fdtab(struct ssdmoe_reader *r, int fd) {
    if (fd < r->fdcap) return 0;
    int cap = r->fdcap ? r->fdcap : 64;
    while (cap <= fd) cap *= 2;
    fd_entry *t = (fd_entry *)realloc(r->fdtab, (size_t)cap * sizeof(fd_entry));
    if (!t) return -ENOMEM;
    for (int i = r->fdcap; i < cap; i++) {
        t[i].registered = 0;
        t[i].mode = MODE_BUFFERED;
        t[i].dfd = -1;
    }
    r->fdtab = t;
    r->fdcap = cap;
    return 0;
}

int ssdmoe_open(ssdmoe_reader *r, const char *path, int direct) {
    if (!r || !path) return -EINVAL;
    if (direct < 0) direct = r->direct_default;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -errno;
    pthread_mutex_lock(&r->call_lock); /* no batch may run while fdtab moves */
    int rc = grow_fdtab(r, fd);
    if (rc) {
        pthread_mutex_unlock(&r->call_lock);
        close(fd);
        return rc;
    }
    fd_entry *e = &r->fdtab[fd];
    e->registered = 1;
    e->mode = MODE_BUFFERED;
    e->dfd = -1;
    if (direct) {
#if defined(__linux__) && defined(O_DIRECT)
        int dfd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
        if (dfd >= 0) {
            e->dfd = dfd;
            e->mode = MODE_ODIRECT;
        } else {
            r->direct_open_errno = errno;
        }
#elif defined(__APPLE__) && defined(F_NOCACHE)
        if (fcntl(fd, F_NOCACHE, 1) == 0)
            e->mode = MODE_NOCACHE;
        else
            r->direct_open_errno = errno;
#else
        r->direct_open_errno = ENOTSUP;
#endif
    }
    pthread_mutex_unlock(&r->call_lock);
    return fd;
}

int ssdmoe_fd_is_direct(ssdmoe_reader *r, int fd) {
    if (!r) return 0;
    pthread_mutex_lock(&r->call_lock);
    int mode = (fd >= 0 && fd < r->fdcap) ? r->fdtab[fd].mode : MODE_BUFFERED;
    pthread_mutex_unlock(&r->call_lock);
    return mode != MODE_BUFFERED;
}

int ssdmoe_direct_open_errno(ssdmoe_reader *r) { return r ? r->direct_open_errno : 0; }

int64_t ssdmoe_direct_fallbacks(ssdmoe_reader *r) {
    return r ? __atomic_load_n(&r->direct_fallbacks, __ATOMIC_RELAXED) : 0;
}

int ssdmoe_close(ssdmoe_reader *r, int fd) {
    if (!r || fd < 0) return -EBADF;
    pthread_mutex_lock(&r->call_lock);
    if (fd < r->fdcap && r->fdtab[fd].registered) {
        if (r->fdtab[fd].dfd >= 0) close(r->fdtab[fd].dfd);
        r->fdtab[fd].registered = 0;
        r->fdtab[fd].mode = MODE_BUFFERED;
        r->fdtab[fd].dfd = -1;
    }
    int rc = close(fd) == 0 ? 0 : -errno;
    pthread_mutex_unlock(&r->call_lock);
    return rc;
}

int ssdmoe_read_batch(ssdmoe_reader *r, int n, const int *fds, const int64_t *offsets,
                      const int64_t *lengths, void *const *dests, int64_t *status_out) {
    return ssdmoe_read_batch_kinds(r, n, fds, offsets, lengths, dests, NULL, status_out);
}

int ssdmoe_read_batch_kinds(ssdmoe_reader *r, int n, const int *fds, const int64_t *offsets,
                            const int64_t *lengths, void *const *dests, const int *kinds,
                            int64_t *status_out) {
    if (!r || n < 0) return -EINVAL;
    if (n == 0) return 0;
    if (!fds || !offsets || !lengths || !dests || !status_out) return -EINVAL;
    pthread_mutex_lock(&r->call_lock);
    batch_t *b = &r->batch;
    int helpers = n - 1 < r->nworkers ? n - 1 : r->nworkers;
    pthread_mutex_lock(&r->lock);
    b->n = n;
    b->fds = fds;
    b->offsets = offsets;
    b->lengths = lengths;
    b->dests = dests;
    b->kinds = kinds;
    b->status = status_out;
    b->next = 0;
    if (helpers > 0) {
        r->gen++;
        r->batch_open = 1;
        for (int i = 0; i < helpers; i++) pthread_cond_signal(&r->work_cv);
    }
    pthread_mutex_unlock(&r->lock);
    run_batch(r, &r->caller);
    if (helpers > 0) {
        /* Wait until no worker is inside the batch, then close it to late wakers. */
        pthread_mutex_lock(&r->lock);
        while (r->active > 0) pthread_cond_wait(&r->done_cv, &r->lock);
        r->batch_open = 0;
        pthread_mutex_unlock(&r->lock);
    }
    pthread_mutex_unlock(&r->call_lock);
    int failed = 0;
    for (int i = 0; i < n; i++)
        if (status_out[i] != lengths[i] || lengths[i] < 0) failed++;
    return failed;
}
