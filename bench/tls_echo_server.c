/* The floor of `bench/tls_echo.py`: a blocking echo server in C, plaintext or over
 * OpenSSL (the same libssl Python's `ssl` module links), so what TLS costs a small
 * keep-alive request/reply with no Python in the server shows on its own.
 *
 * Usage: tls_echo_server PORT REPLY_BYTES [PEM]
 *   Listens on 127.0.0.1:PORT (0: a port the kernel picks) and prints "ready PORT" once
 *   listening. Serves one connection:
 *   every read (one TLS record, or what one read(2) returns) is answered with REPLY_BYTES
 *   bytes. With PEM (certificate chain and key in one file) it speaks TLS. At the end of
 *   the connection it prints "requests=N" and exits; the bench reads its CPU time from /proc.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s PORT REPLY_BYTES [PEM]\n", argv[0]);
        return 2;
    }
    int port = atoi(argv[1]);
    size_t reply_len = (size_t)atoi(argv[2]);
    if (port < 0 || port > 65535 || reply_len == 0 || reply_len > 16384) {
        fprintf(stderr, "bad port or reply size\n");
        return 2;
    }
    SSL_CTX *ctx = NULL;
    if (argc > 3) {
        ctx = SSL_CTX_new(TLS_server_method());
        if (ctx == NULL || SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) != 1 ||
            SSL_CTX_use_certificate_chain_file(ctx, argv[3]) != 1 ||
            SSL_CTX_use_PrivateKey_file(ctx, argv[3], SSL_FILETYPE_PEM) != 1) {
            ERR_print_errors_fp(stderr);
            return 1;
        }
    }
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((unsigned short)port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(ls, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(ls, 4) != 0) {
        perror("bind/listen");
        return 1;
    }
    socklen_t alen = sizeof addr;
    if (getsockname(ls, (struct sockaddr *)&addr, &alen) != 0) {
        perror("getsockname");
        return 1;
    }
    printf("ready %d\n", ntohs(addr.sin_port));
    fflush(stdout);
    int c = accept(ls, NULL, NULL);
    if (c < 0) {
        perror("accept");
        return 1;
    }
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    SSL *s = NULL;
    if (ctx != NULL) {
        s = SSL_new(ctx);
        SSL_set_fd(s, c);
        if (SSL_accept(s) != 1) {
            ERR_print_errors_fp(stderr);
            return 1;
        }
    }
    static char buf[65536];
    static char reply[16384];
    memset(reply, 'x', reply_len);
    long n = 0;
    for (;;) {
        int got = s ? SSL_read(s, buf, sizeof buf) : (int)read(c, buf, sizeof buf);
        if (got <= 0)
            break;
        int put = s ? SSL_write(s, reply, (int)reply_len) : (int)write(c, reply, reply_len);
        if (put != (int)reply_len)
            break;
        n++;
    }
    printf("requests=%ld\n", n);
    fflush(stdout);
    return 0;
}
