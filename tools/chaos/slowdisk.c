/* A slow disk for one process, without FUSE or block devices: an LD_PRELOAD shim.
 *
 * Every write(2)-family call and fsync/fdatasync on a file whose path starts with
 * $SLOWDISK_DIR sleeps first, while the file $SLOWDISK_SWITCH exists:
 *   $SLOWDISK_WRITE_US   microseconds before each write, pwrite, writev (default 2000)
 *   $SLOWDISK_SYNC_US    microseconds before each fsync, fdatasync      (default 50000)
 * Each delayed call is counted; the count is written as decimal text to
 * $SLOWDISK_COUNT (if set) after every delayed call, so it survives a SIGKILL.
 *
 * What it cannot slow: writes through a memory map, reads, and the kernel's own writeback
 * (replicad writes segments, index files and checkpoints with write/pwrite: all slowed). Sockets, pipes and files elsewhere are never
 * touched: the fd's path is looked up in /proc/self/fd.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static const char *dir_prefix;
static size_t dir_prefix_len;
static const char *switch_path;
static const char *count_path;
static long write_us = 2000;
static long sync_us = 50000;
static atomic_long delayed;

static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_pwrite)(int, const void *, size_t, off_t);
static ssize_t (*real_pwrite64)(int, const void *, size_t, off_t);
static ssize_t (*real_writev)(int, const struct iovec *, int);
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);

__attribute__((constructor)) static void slowdisk_init(void) {
    real_write = dlsym(RTLD_NEXT, "write");
    real_pwrite = dlsym(RTLD_NEXT, "pwrite");
    real_pwrite64 = dlsym(RTLD_NEXT, "pwrite64");
    real_writev = dlsym(RTLD_NEXT, "writev");
    real_fsync = dlsym(RTLD_NEXT, "fsync");
    real_fdatasync = dlsym(RTLD_NEXT, "fdatasync");
    dir_prefix = getenv("SLOWDISK_DIR");
    dir_prefix_len = dir_prefix ? strlen(dir_prefix) : 0;
    switch_path = getenv("SLOWDISK_SWITCH");
    count_path = getenv("SLOWDISK_COUNT");
    const char *w = getenv("SLOWDISK_WRITE_US");
    const char *s = getenv("SLOWDISK_SYNC_US");
    if (w) write_us = atol(w);
    if (s) sync_us = atol(s);
}

static int on_slow_disk(int fd) {
    if (dir_prefix_len == 0) return 0;
    if (switch_path && access(switch_path, F_OK) != 0) return 0;
    char link[64];
    char path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0) return 0;
    path[n] = '\0';
    return strncmp(path, dir_prefix, dir_prefix_len) == 0;
}

static void record_delay(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
    long count = atomic_fetch_add(&delayed, 1) + 1;
    if (count_path) {
        int fd = open(count_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd >= 0) {
            char text[32];
            int len = snprintf(text, sizeof text, "%ld\n", count);
            real_write(fd, text, (size_t)len);
            close(fd);
        }
    }
}

ssize_t write(int fd, const void *buf, size_t count) {
    if (on_slow_disk(fd)) record_delay(write_us);
    return real_write(fd, buf, count);
}

ssize_t pwrite(int fd, const void *buf, size_t count, off_t offset) {
    if (on_slow_disk(fd)) record_delay(write_us);
    return real_pwrite(fd, buf, count, offset);
}

ssize_t pwrite64(int fd, const void *buf, size_t count, off_t offset) {
    if (on_slow_disk(fd)) record_delay(write_us);
    return real_pwrite64(fd, buf, count, offset);
}

ssize_t writev(int fd, const struct iovec *iov, int iovcnt) {
    if (on_slow_disk(fd)) record_delay(write_us);
    return real_writev(fd, iov, iovcnt);
}

int fsync(int fd) {
    if (on_slow_disk(fd)) record_delay(sync_us);
    return real_fsync(fd);
}

int fdatasync(int fd) {
    if (on_slow_disk(fd)) record_delay(sync_us);
    return real_fdatasync(fd);
}
