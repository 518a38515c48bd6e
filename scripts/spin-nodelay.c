/*
 * spin-nodelay.so: turns Nagle's algorithm off (TCP_NODELAY) on every
 * socket a process accepts. Loaded into `spin up` with LD_PRELOAD by
 * `./dev spin` (README, "Deploy with Spin").
 *
 * Why: Spin 4.0.2's HTTP listener leaves Nagle on. A streamed answer is
 * written in several small pieces; the second waits until the client
 * acknowledges the first, and a client that has nothing to send delays
 * that acknowledgement by 40 ms. So every answer the gateway streams
 * ended about 40 ms late (`edgeroute bench --spin-gateway` measures it
 * with and without this). The fix belongs in Spin (one `set_nodelay` on
 * its accepted connections); until then this does it from outside, and
 * changes nothing else: the call is the same, its result is returned
 * unchanged, and a socket that is not TCP ignores the option.
 *
 * Not a crate: it has to be a C-ABI shared object that wraps libc's own
 * symbols, the one thing LD_PRELOAD can load.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

static void no_delay(int fd) {
    if (fd >= 0) {
        int one = 1;
        int saved = errno;
        /* Fails harmlessly (EOPNOTSUPP) on a Unix socket; errno is put
           back, so the caller sees accept's own. */
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        errno = saved;
    }
}

int accept4(int listener, struct sockaddr *addr, socklen_t *len, int flags) {
    static int (*real)(int, struct sockaddr *, socklen_t *, int);
    if (!real) real = (int (*)(int, struct sockaddr *, socklen_t *, int))dlsym(RTLD_NEXT, "accept4");
    if (!real) {
        errno = ENOSYS;
        return -1;
    }
    int fd = real(listener, addr, len, flags);
    no_delay(fd);
    return fd;
}

int accept(int listener, struct sockaddr *addr, socklen_t *len) {
    static int (*real)(int, struct sockaddr *, socklen_t *);
    if (!real) real = (int (*)(int, struct sockaddr *, socklen_t *))dlsym(RTLD_NEXT, "accept");
    if (!real) {
        errno = ENOSYS;
        return -1;
    }
    int fd = real(listener, addr, len);
    no_delay(fd);
    return fd;
}
