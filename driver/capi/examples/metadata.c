/*
 * Metadata and end-to-end protection information from C: the _ext
 * functions (upnvme_write_ext, upnvme_read_ext, upnvme_write_zeroes_ext)
 * with struct upnvme_io_ext — a separate metadata buffer (md) and the
 * protection fields (pi, ref_tag, app_tag).
 *
 * For each namespace named (default 1) whose format has metadata:
 * - it prints the layout (upnvme_ns_get_info: metadata size, extended LBA or
 *   separate buffer, PI type, where the tuple sits, guard size);
 * - without protection information: writes 4 blocks of data and metadata
 *   and reads both back, byte for byte;
 * - with protection information:
 *   1. writes 4 blocks with PRACT (the controller generates each block's
 *      tuple) and the guard and reference tag checks;
 *   2. reads them back without PRACT, data and metadata (in the blocks or
 *      in the md buffer), checks the data and that each tuple's reference
 *      tag is its LBA (Type 1 and 2) — and reads again with PRACT, where the
 *      controller checks and, when the metadata is only the tuple, strips it;
 *   3. writes the blocks back with one tuple's reference tag changed and no
 *      checks, then reads with the checks: End-to-end Reference Tag Check
 *      Error (SCT 2h, SC 84h);
 *   4. Write Zeroes with PRACT, then a checked read: zeroes with valid
 *      tuples.
 *
 *   cc -o metadata_c metadata.c $(pkg-config --cflags --libs upnvme)
 *   ./metadata_c [0000:00:04.0 [NSID...]]
 *
 * It uses blocks 200 to 203 of each namespace (their data is overwritten).
 * (inside the test bed, whose metadata-pi configuration formats namespaces
 * with metadata: `cargo xtask vm --ms 8 --mset 1 --pi 1 -- metadata_c`)
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <upnvme.h>

#define SLBA 200u
#define BLOCKS 4u

static int fail(const char *what, int rc)
{
    fprintf(stderr, "%s failed (%s): %s\n", what, upnvme_strerror(rc), upnvme_last_error());
    return 1;
}

struct done {
    int done;
    int status;
    uint8_t sct, sc;
    struct upnvme_buf *buf, *md;
};

static void on_done(void *arg, const struct upnvme_cpl *cpl)
{
    struct done *d = arg;
    d->status = cpl->status;
    d->sct = cpl->sct;
    d->sc = cpl->sc;
    d->buf = cpl->buf;
    d->md = cpl->md;
    d->done = 1;
}

/* Polls until `d` is done, at most 10 s (nothing waits forever). `d` is
 * main's: a command given up here keeps it until the pair is destroyed,
 * which runs its callback after this function has returned. */
static int wait_for(struct upnvme_qpair *qp, int rc, struct done *d)
{
    if (rc != UPNVME_OK)
        return rc;
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    while (!d->done) {
        rc = upnvme_qpair_process_completions(qp, 0);
        if (rc < 0)
            return rc;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - start.tv_sec > 10)
            return UPNVME_ETIMEDOUT;
    }
    return d->status;
}

/* Fills `len` bytes with a pattern of `seed`. */
static void fill(uint8_t *p, size_t len, unsigned seed)
{
    for (size_t i = 0; i < len; i++)
        p[i] = (uint8_t)(seed * 29 + i * 13 + i / 509);
}

/* Where block `i`'s data and metadata are: in the data buffer one after the
 * other (extended LBA), or the data in `data` and the metadata in `md`. */
struct layout {
    uint32_t lba, ms;
    int extended;
};

static uint8_t *block_data(const struct layout *l, uint8_t *data, uint32_t i)
{
    return data + (size_t)i * (l->extended ? l->lba + l->ms : l->lba);
}

static uint8_t *block_md(const struct layout *l, uint8_t *data, uint8_t *md, uint32_t i)
{
    return l->extended ? data + (size_t)i * (l->lba + l->ms) + l->lba : md + (size_t)i * l->ms;
}

/* Block `i`'s data in `p`: packed (data only, what a transfer with PRACT
 * moves where the tuple is all the metadata) or as the format lays it out. */
static uint8_t *data_at(const struct layout *l, uint8_t *p, int packed, uint32_t i)
{
    return packed ? p + (size_t)i * l->lba : block_data(l, p, i);
}

/* Whether each block's data in `got` is `want`'s, each packed or not. */
static int data_matches(const struct layout *l, uint8_t *got, int got_packed, uint8_t *want,
                        int want_packed)
{
    for (uint32_t i = 0; i < BLOCKS; i++) {
        if (memcmp(data_at(l, got, got_packed, i), data_at(l, want, want_packed, i), l->lba) != 0)
            return 0;
    }
    return 1;
}

/* The reference tag of a tuple: bytes 7:4 (16-bit guard) or the low 48
 * bits of bytes 15:10 (64-bit guard, no storage tag), big-endian. */
static uint64_t ref_tag(const uint8_t *t, unsigned guard_bits)
{
    uint64_t v = 0;
    unsigned from = guard_bits == 64 ? 10 : 4, to = guard_bits == 64 ? 16 : 8;
    for (unsigned k = from; k < to; k++)
        v = v << 8 | t[k];
    return v;
}

static void set_ref_tag(uint8_t *t, unsigned guard_bits, uint64_t v)
{
    unsigned from = guard_bits == 64 ? 10 : 4, to = guard_bits == 64 ? 16 : 8;
    for (unsigned k = to; k-- > from;) {
        t[k] = (uint8_t)v;
        v >>= 8;
    }
}

static int one_namespace(struct upnvme_ctrl *ctrl, struct upnvme_qpair *qp, uint32_t nsid,
                         struct upnvme_buf *data, struct upnvme_buf *md, struct done *d)
{
    struct upnvme_ns_info ns;
    int rc = upnvme_ns_get_info(ctrl, nsid, &ns);
    if (rc != UPNVME_OK)
        return fail("upnvme_ns_get_info", rc);
    if (ns.metadata_size == 0) {
        printf("namespace %u: no metadata in its format, nothing to show\n", nsid);
        return 0;
    }
    if (ns.blocks < SLBA + BLOCKS)
        return fail("namespace size (too small)", UPNVME_EINVAL);
    struct layout l = {ns.lba_size, ns.metadata_size, ns.metadata_extended};
    printf("namespace %u: %u-byte blocks with %u bytes of metadata, %s, PI type %u",
           nsid, l.lba, l.ms, l.extended ? "extended LBA" : "separate buffer", ns.pi_type);
    if (ns.pi_type != 0)
        printf(" (%u-bit guard, tuple in the %s bytes)", ns.pi_guard_bits,
               ns.pi_first ? "first" : "last");
    printf("\n");
    size_t bytes = (size_t)BLOCKS * (l.extended ? l.lba + l.ms : l.lba);
    if (upnvme_buf_len(data) < bytes || upnvme_buf_len(md) < (size_t)BLOCKS * l.ms)
        return fail("the example's buffers (too small for this format)", UPNVME_EINVAL);
    uint8_t *p = upnvme_buf_data(data), *m = upnvme_buf_data(md);
    /* The metadata buffer goes only where the format keeps metadata apart. */
    struct upnvme_io_ext ext = {.size = sizeof ext, .md = l.extended ? NULL : md};
    uint8_t *want = malloc(bytes);
    uint8_t *want_md = malloc((size_t)BLOCKS * l.ms);
    if (!want || !want_md) {
        free(want);
        free(want_md);
        return fail("malloc", UPNVME_ENOMEM);
    }
    int ret = 1;

    if (ns.pi_type == 0) {
        fill(p, bytes, nsid);
        fill(m, (size_t)BLOCKS * l.ms, nsid + 7);
        memcpy(want, p, bytes);
        memcpy(want_md, m, (size_t)BLOCKS * l.ms);
        *d = (struct done){0};
        rc = wait_for(qp, upnvme_write_ext(qp, nsid, data, SLBA, BLOCKS, &ext, on_done, d), d);
        if (rc != UPNVME_OK) {
            fail("upnvme_write_ext", rc);
            goto out;
        }
        memset(p, 0, bytes);
        memset(m, 0, (size_t)BLOCKS * l.ms);
        *d = (struct done){0};
        rc = wait_for(qp, upnvme_read_ext(qp, nsid, data, SLBA, BLOCKS, &ext, on_done, d), d);
        if (rc != UPNVME_OK) {
            fail("upnvme_read_ext", rc);
            goto out;
        }
        if (memcmp(p, want, bytes) != 0 ||
            (!l.extended && memcmp(m, want_md, (size_t)BLOCKS * l.ms) != 0)) {
            fprintf(stderr, "namespace %u: data or metadata read back differs\n", nsid);
            goto out;
        }
        printf("namespace %u: %u blocks of data and metadata written and read back equal\n",
               nsid, BLOCKS);
        ret = 0;
        goto out;
    }

    /* The tuple is the whole metadata: with PRACT it never crosses to the
     * host (the buffers carry data only, no md). */
    unsigned tuple = ns.pi_guard_bits == 16 ? 8 : 16;
    int stripped = l.ms == tuple;
    size_t off = ns.pi_first ? 0 : l.ms - tuple;
    /* Type 3 has no reference tag to check: the guard only, and steps 2's
     * tag check and 3 do not apply. */
    int type3 = ns.pi_type == 3;
    uint32_t checks = UPNVME_PI_CHECK_GUARD | (type3 ? 0 : UPNVME_PI_CHECK_REF_TAG);
    struct upnvme_io_ext pract = {.size = sizeof pract,
                                  .pi = UPNVME_PI_PRACT | checks,
                                  .md = stripped || l.extended ? NULL : md};

    /* 1. Data only where PRACT strips the metadata, else data and metadata
     * the controller fills in. */
    fill(p, bytes, nsid + 100);
    memcpy(want, p, bytes);
    *d = (struct done){0};
    rc = wait_for(qp, upnvme_write_ext(qp, nsid, data, SLBA, BLOCKS, &pract, on_done, d), d);
    if (rc != UPNVME_OK) {
        fail("upnvme_write_ext (PRACT)", rc);
        goto out;
    }
    /* 2. Data and tuples back, checked by the controller. */
    memset(p, 0, bytes);
    memset(m, 0, (size_t)BLOCKS * l.ms);
    struct upnvme_io_ext checked = ext;
    checked.pi = checks;
    *d = (struct done){0};
    rc = wait_for(qp, upnvme_read_ext(qp, nsid, data, SLBA, BLOCKS, &checked, on_done, d), d);
    if (rc != UPNVME_OK) {
        fail("upnvme_read_ext (checked)", rc);
        goto out;
    }
    if (d->buf != data || d->md != checked.md) {
        fprintf(stderr, "namespace %u: the completion named other buffers\n", nsid);
        goto out;
    }
    if (!data_matches(&l, p, 0, want, stripped)) {
        fprintf(stderr, "namespace %u: the data read back differs\n", nsid);
        goto out;
    }
    for (uint32_t i = 0; i < BLOCKS && !type3; i++) {
        uint8_t *t = block_md(&l, p, m, i) + off;
        if (ref_tag(t, ns.pi_guard_bits) != SLBA + i) {
            fprintf(stderr, "namespace %u: block %u's reference tag is %llu, not its LBA\n",
                    nsid, i, (unsigned long long)ref_tag(t, ns.pi_guard_bits));
            goto out;
        }
    }
    printf("namespace %u: %u blocks written with PRACT, read back with their tuples%s\n", nsid,
           BLOCKS, type3 ? " (Type 3: no reference tags)" : ": each reference tag is its LBA");
    /* The same read with PRACT: checked, and stripped where the tuple is
     * all the metadata. */
    uint8_t *kept = malloc(bytes);
    if (!kept) {
        fail("malloc", UPNVME_ENOMEM);
        goto out;
    }
    memcpy(kept, p, bytes);
    memcpy(want_md, m, (size_t)BLOCKS * l.ms);
    memset(p, 0, bytes);
    *d = (struct done){0};
    rc = wait_for(qp, upnvme_read_ext(qp, nsid, data, SLBA, BLOCKS, &pract, on_done, d), d);
    if (rc != UPNVME_OK || !data_matches(&l, p, stripped, want, stripped)) {
        free(kept);
        if (rc != UPNVME_OK)
            fail("upnvme_read_ext (PRACT)", rc);
        else
            fprintf(stderr, "namespace %u: the data read with PRACT differs\n", nsid);
        goto out;
    }
    printf("namespace %u: read with PRACT, %s\n", nsid,
           stripped ? "the controller checked and stripped the tuples" : "checked");

    /* 3. One tuple's reference tag changed, written without checks. */
    memcpy(p, kept, bytes);
    memcpy(m, want_md, (size_t)BLOCKS * l.ms);
    free(kept);
    if (type3)
        goto zeroes;
    uint8_t *t = block_md(&l, p, m, 2) + off;
    set_ref_tag(t, ns.pi_guard_bits, ref_tag(t, ns.pi_guard_bits) ^ 0x5a);
    *d = (struct done){0};
    rc = wait_for(qp, upnvme_write_ext(qp, nsid, data, SLBA, BLOCKS, &ext, on_done, d), d);
    if (rc != UPNVME_OK) {
        fail("upnvme_write_ext (a changed reference tag)", rc);
        goto out;
    }
    *d = (struct done){0};
    rc = wait_for(qp, upnvme_read_ext(qp, nsid, data, SLBA, BLOCKS, &checked, on_done, d), d);
    if (rc != UPNVME_EIO || d->sct != 2 || d->sc != 0x84) {
        fprintf(stderr, "namespace %u: the checked read of a wrong reference tag gave %s "
                "(sct %u sc %#x), not Reference Tag Check Error\n",
                nsid, upnvme_strerror(rc), d->sct, d->sc);
        goto out;
    }
    printf("namespace %u: a wrong reference tag is End-to-end Reference Tag Check Error "
           "(sct 2 sc 0x84)\n",
           nsid);

zeroes:;
    /* 4. Write Zeroes with PRACT: valid tuples again. */
    struct upnvme_io_ext wz = {.size = sizeof wz, .pi = UPNVME_PI_PRACT};
    *d = (struct done){0};
    rc = wait_for(qp, upnvme_write_zeroes_ext(qp, nsid, SLBA, BLOCKS, false, &wz, on_done, d),
                  d);
    if (rc == UPNVME_ENOTSUP) {
        printf("namespace %u: Write Zeroes not supported, refused\n", nsid);
        ret = 0;
        goto out;
    }
    if (rc != UPNVME_OK) {
        fail("upnvme_write_zeroes_ext (PRACT)", rc);
        goto out;
    }
    memset(p, 0xee, bytes);
    *d = (struct done){0};
    rc = wait_for(qp, upnvme_read_ext(qp, nsid, data, SLBA, BLOCKS, &checked, on_done, d), d);
    if (rc != UPNVME_OK) {
        fprintf(stderr, "namespace %u: checked read after Write Zeroes: sct %u sc %#x\n", nsid,
                d->sct, d->sc);
        fail("upnvme_read_ext (after Write Zeroes)", rc);
        goto out;
    }
    for (uint32_t i = 0; i < BLOCKS; i++) {
        const uint8_t *b = block_data(&l, p, i);
        for (uint32_t k = 0; k < l.lba; k++) {
            if (b[k] != 0) {
                fprintf(stderr, "namespace %u: block %u is not zeroed\n", nsid, i);
                goto out;
            }
        }
    }
    printf("namespace %u: Write Zeroes with PRACT reads back as checked zeroes\n", nsid);
    ret = 0;
out:
    free(want);
    free(want_md);
    return ret;
}

int main(int argc, char **argv)
{
    const char *addr = argc > 1 ? argv[1] : NULL;
    struct upnvme_ctrl *ctrl = NULL;
    struct upnvme_qpair *qp = NULL;
    struct upnvme_buf *data = NULL, *md = NULL;
    /* Every command's completion: alive until main returns, past the
     * callbacks the pair's destroy runs (see wait_for). */
    struct done d = {0};
    int ret = 1;

    int rc = upnvme_ctrl_open(addr, NULL, &ctrl);
    if (rc != UPNVME_OK) {
        fail("upnvme_ctrl_open", rc);
        goto out;
    }
    rc = upnvme_qpair_create(ctrl, NULL, &qp);
    if (rc != UPNVME_OK) {
        fail("upnvme_qpair_create", rc);
        goto out;
    }
    /* Room for 4 blocks of up to 4 KiB data and 64 bytes of metadata. */
    rc = upnvme_buf_alloc(ctrl, BLOCKS * (4096 + 64), &data);
    if (rc == UPNVME_OK)
        rc = upnvme_buf_alloc(ctrl, 4096, &md);
    if (rc != UPNVME_OK) {
        fail("upnvme_buf_alloc", rc);
        goto out;
    }
    ret = 0;
    if (argc <= 2) {
        ret = one_namespace(ctrl, qp, 1, data, md, &d);
    } else {
        for (int i = 2; i < argc && ret == 0; i++)
            ret = one_namespace(ctrl, qp, (uint32_t)strtoul(argv[i], NULL, 0), data, md, &d);
    }
out:
    if (qp)
        upnvme_qpair_destroy(qp);
    /* A buffer still held by a command the pair could not end is freed
     * with its handle; the library keeps the memory the device may use. */
    if (data)
        upnvme_buf_free(data);
    if (md)
        upnvme_buf_free(md);
    if (ctrl)
        upnvme_ctrl_close(ctrl);
    return ret;
}
