/* BLAKE2b (RFC 7693), unkeyed, for the log's hash chain in the Cython codec.
 *
 * Written from the RFC's description; `tests/property/test_codec_agree.py` checks it against
 * Python's hashlib.blake2b on random inputs. Only what the chain needs: a one-shot digest of
 * (prev ++ entry) with a 1..64-byte output, no key, no salt.
 */
#ifndef MERCURY_BLAKE2B_H
#define MERCURY_BLAKE2B_H

#include <stdint.h>
#include <string.h>

static const uint64_t mb2_iv[8] = {
    0x6a09e667f3bcc908ULL, 0xbb67ae8584caa73bULL, 0x3c6ef372fe94f82bULL,
    0xa54ff53a5f1d36f1ULL, 0x510e527fade682d1ULL, 0x9b05688c2b3e6c1fULL,
    0x1f83d9abfb41bd6bULL, 0x5be0cd19137e2179ULL};

static const uint8_t mb2_sigma[12][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4},
    {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13},
    {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11},
    {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5},
    {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3}};

typedef struct {
    uint64_t h[8];
    uint64_t t[2];
    uint8_t buf[128];
    size_t fill;
    size_t outlen;
} mb2_state;

static inline uint64_t mb2_rotr(uint64_t x, int n) { return (x >> n) | (x << (64 - n)); }

static inline uint64_t mb2_load64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8); /* little-endian hosts only (x86-64, aarch64) */
    return v;
}

#define MB2_G(a, b, c, d, x, y)          \
    do {                                 \
        v[a] = v[a] + v[b] + (x);        \
        v[d] = mb2_rotr(v[d] ^ v[a], 32); \
        v[c] = v[c] + v[d];              \
        v[b] = mb2_rotr(v[b] ^ v[c], 24); \
        v[a] = v[a] + v[b] + (y);        \
        v[d] = mb2_rotr(v[d] ^ v[a], 16); \
        v[c] = v[c] + v[d];              \
        v[b] = mb2_rotr(v[b] ^ v[c], 63); \
    } while (0)

static void mb2_compress(mb2_state *s, const uint8_t *block, int last) {
    uint64_t v[16], m[16];
    int i;
    for (i = 0; i < 8; i++) {
        v[i] = s->h[i];
        v[i + 8] = mb2_iv[i];
    }
    v[12] ^= s->t[0];
    v[13] ^= s->t[1];
    if (last) v[14] = ~v[14];
    for (i = 0; i < 16; i++) m[i] = mb2_load64(block + 8 * i);
    for (i = 0; i < 12; i++) {
        const uint8_t *sg = mb2_sigma[i];
        MB2_G(0, 4, 8, 12, m[sg[0]], m[sg[1]]);
        MB2_G(1, 5, 9, 13, m[sg[2]], m[sg[3]]);
        MB2_G(2, 6, 10, 14, m[sg[4]], m[sg[5]]);
        MB2_G(3, 7, 11, 15, m[sg[6]], m[sg[7]]);
        MB2_G(0, 5, 10, 15, m[sg[8]], m[sg[9]]);
        MB2_G(1, 6, 11, 12, m[sg[10]], m[sg[11]]);
        MB2_G(2, 7, 8, 13, m[sg[12]], m[sg[13]]);
        MB2_G(3, 4, 9, 14, m[sg[14]], m[sg[15]]);
    }
    for (i = 0; i < 8; i++) s->h[i] ^= v[i] ^ v[i + 8];
}

static void mb2_init(mb2_state *s, size_t outlen) {
    int i;
    for (i = 0; i < 8; i++) s->h[i] = mb2_iv[i];
    s->h[0] ^= 0x01010000ULL ^ (uint64_t)outlen;
    s->t[0] = s->t[1] = 0;
    s->fill = 0;
    s->outlen = outlen;
}

static void mb2_update(mb2_state *s, const uint8_t *in, size_t n) {
    while (n > 0) {
        if (s->fill == 128) {
            /* a full buffer is compressed only once more input follows: the last block
               must be compressed with the final flag */
            s->t[0] += 128;
            if (s->t[0] < 128) s->t[1]++;
            mb2_compress(s, s->buf, 0);
            s->fill = 0;
        }
        size_t take = 128 - s->fill;
        if (take > n) take = n;
        memcpy(s->buf + s->fill, in, take);
        s->fill += take;
        in += take;
        n -= take;
    }
}

static void mb2_final(mb2_state *s, uint8_t *out) {
    uint8_t full[64];
    int i;
    s->t[0] += s->fill;
    if (s->t[0] < s->fill) s->t[1]++;
    memset(s->buf + s->fill, 0, 128 - s->fill);
    mb2_compress(s, s->buf, 1);
    for (i = 0; i < 8; i++) memcpy(full + 8 * i, &s->h[i], 8);
    memcpy(out, full, s->outlen);
}

/* out = BLAKE2b-outlen(a ++ b) */
static inline void mb2_digest2(const uint8_t *a, size_t an, const uint8_t *b, size_t bn,
                               uint8_t *out, size_t outlen) {
    mb2_state s;
    mb2_init(&s, outlen);
    mb2_update(&s, a, an);
    mb2_update(&s, b, bn);
    mb2_final(&s, out);
}

#endif
