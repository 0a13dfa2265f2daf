/* A small closed-loop load generator for point reads (bench/read_throughput.py).
 *
 * C speed, so the client is never the bottleneck of a one-core server: C keep-alive
 * connections, each with one request in flight (no pipelining), cycling over the given
 * keys; per-request latency (send -> whole reply received) into a 1 us histogram.
 *
 *   loadgen MODE PORT CONNS SECONDS KEY...
 *
 * MODE: "http" (GET /v1/kv/KEY on Mercury, or GET /KEY on KT: the key is sent as the whole
 * path given, so pass "/v1/kv/01" or "/01"), or "memcached" (get KEY). A reply is complete
 * at the end of its Content-Length body (HTTP) or at "END\r\n" (memcached); a reply with
 * another status than 200, or a memcached miss, is counted in "errors".
 * Prints one JSON line: requests, errors, seconds, per_s, p50_us, p90_us, p99_us, p999_us,
 * max_us. Bounded: it stops after SECONDS, or at once on any socket error.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define HIST 200000 /* 1 us buckets up to 200 ms; slower replies land in the last one */
#define BUF 65536

struct conn {
    int fd;
    int next_key;
    uint64_t sent_ns;
    size_t have;
    char buf[BUF];
};

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int http_mode;
static char **keys;
static int nkeys;
static uint64_t hist[HIST];
static uint64_t requests, errors, max_us;

static int send_request(struct conn *c) {
    char req[1024];
    const char *k = keys[c->next_key];
    c->next_key = (c->next_key + 1) % nkeys;
    int n = http_mode
                ? snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", k)
                : snprintf(req, sizeof req, "get %s\r\n", k);
    c->sent_ns = now_ns();
    c->have = 0;
    return write(c->fd, req, (size_t)n) == n ? 0 : -1;
}

/* 1: a whole reply is in buf (ok set), 0: need more, -1: malformed. */
static int reply_complete(struct conn *c, int *ok) {
    if (!http_mode) {
        if (c->have >= 5 && memcmp(c->buf + c->have - 5, "END\r\n", 5) == 0) {
            *ok = c->have > 5; /* a hit has a VALUE line before END */
            return 1;
        }
        if (c->have >= 2 && memcmp(c->buf + c->have - 2, "\r\n", 2) == 0 &&
            (memcmp(c->buf, "SERVER_ERROR", 12) == 0 || memcmp(c->buf, "ERROR", 5) == 0)) {
            *ok = 0;
            return 1;
        }
        return 0;
    }
    char *end = memmem(c->buf, c->have, "\r\n\r\n", 4);
    if (!end) return 0;
    size_t head = (size_t)(end - c->buf) + 4;
    long len = -1;
    for (char *p = c->buf; p < end; p++) {
        if ((p == c->buf || p[-1] == '\n') && strncasecmp(p, "content-length:", 15) == 0) {
            len = strtol(p + 15, NULL, 10);
            break;
        }
    }
    if (len < 0) return -1;
    if (c->have < head + (size_t)len) return 0;
    *ok = c->have >= 12 && memcmp(c->buf + 9, "200", 3) == 0;
    return 1;
}

static uint64_t pct(double q) {
    uint64_t want = (uint64_t)(q * (double)requests), seen = 0;
    for (int i = 0; i < HIST; i++) {
        seen += hist[i];
        if (seen > want) return (uint64_t)i;
    }
    return HIST - 1;
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: loadgen http|memcached PORT CONNS SECONDS KEY...\n");
        return 2;
    }
    http_mode = strcmp(argv[1], "http") == 0;
    int port = atoi(argv[2]), nconn = atoi(argv[3]);
    double seconds = atof(argv[4]);
    keys = argv + 5;
    nkeys = argc - 5;
    int ep = epoll_create1(0);
    struct conn *conns = calloc((size_t)nconn, sizeof *conns);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    for (int i = 0; i < nconn; i++) {
        struct conn *c = &conns[i];
        c->fd = socket(AF_INET, SOCK_STREAM, 0);
        int one = 1;
        setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (connect(c->fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
            perror("connect");
            return 1;
        }
        c->next_key = i % nkeys;
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
        epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev);
    }
    uint64_t t0 = now_ns(), stop = t0 + (uint64_t)(seconds * 1e9);
    for (int i = 0; i < nconn; i++)
        if (send_request(&conns[i]) != 0) {
            perror("write");
            return 1;
        }
    struct epoll_event evs[256];
    uint64_t t = t0;
    while (t < stop) {
        int n = epoll_wait(ep, evs, 256, 100);
        t = now_ns();
        for (int i = 0; i < n; i++) {
            struct conn *c = evs[i].data.ptr;
            ssize_t r = read(c->fd, c->buf + c->have, BUF - c->have);
            if (r <= 0) {
                fprintf(stderr, "connection closed by the server\n");
                return 1;
            }
            c->have += (size_t)r;
            int ok = 0, done = reply_complete(c, &ok);
            if (done < 0 || (done == 0 && c->have == BUF)) {
                fprintf(stderr, "malformed or oversized reply\n");
                return 1;
            }
            if (!done) continue;
            uint64_t us = (now_ns() - c->sent_ns) / 1000;
            hist[us < HIST ? us : HIST - 1]++;
            if (us > max_us) max_us = us;
            requests++;
            if (!ok) errors++;
            if (t < stop && send_request(c) != 0) {
                perror("write");
                return 1;
            }
        }
    }
    double dt = (double)(now_ns() - t0) / 1e9;
    printf("{\"requests\": %llu, \"errors\": %llu, \"seconds\": %.3f, \"per_s\": %.0f, "
           "\"p50_us\": %llu, \"p90_us\": %llu, \"p99_us\": %llu, \"p999_us\": %llu, "
           "\"max_us\": %llu}\n",
           (unsigned long long)requests, (unsigned long long)errors, dt, (double)requests / dt,
           (unsigned long long)pct(0.50), (unsigned long long)pct(0.90),
           (unsigned long long)pct(0.99), (unsigned long long)pct(0.999),
           (unsigned long long)max_us);
    return 0;
}
