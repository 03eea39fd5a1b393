/*
 * A stand-in for libupnvme_c that the C examples link against on the host
 * (tests/examples.rs): one controller, one pair, one command at a time,
 * namespace 1 (and 2 with STUB_NS2) of 512-byte blocks whose blocks
 * 60000..60015 hold data. STUB_ONCS (hex) is the controller's ONCS (Copy
 * by default; Compare is bit 0; Verify and Write Uncorrectable are never
 * reported). STUB_HANG: the first command never completes, so the example
 * times out; once the controller is closed, destroying the pair ends that
 * command with UPNVME_ENODEV, as the library does, after checking that its
 * callback argument is not in a stack frame that has returned.
 * clock_gettime is replaced: each call is one second later.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "upnvme.h"

#define BASE 60000u
#define N 16u
#define LBA 512u

struct upnvme_ctrl {
    int unused;
};
struct upnvme_qpair {
    int unused;
};
struct upnvme_buf {
    uint8_t *p;
    size_t len;
};

static struct upnvme_ctrl the_ctrl;
static struct upnvme_qpair the_qp;
static uint8_t media[3][N * LBA];
static int closed, submitted;
static struct {
    int live, hung;
    upnvme_cmd_cb cb;
    void *arg;
    struct upnvme_cpl cpl;
} pend;

static long fake_sec;
int clock_gettime(clockid_t clock, struct timespec *t)
{
    (void)clock;
    t->tv_sec = fake_sec++;
    t->tv_nsec = 0;
    return 0;
}

static uint16_t oncs(void)
{
    const char *s = getenv("STUB_ONCS");
    return s ? (uint16_t)strtoul(s, NULL, 16) : UPNVME_ONCS_COPY;
}

static int has_ns(uint32_t nsid)
{
    return nsid == 1 || (nsid == 2 && getenv("STUB_NS2"));
}

/* The data of `blocks` blocks at `slba` of `nsid`, or NULL. */
static uint8_t *at(uint32_t nsid, uint64_t slba, uint64_t blocks)
{
    if (!has_ns(nsid) || slba < BASE || blocks == 0 || slba + blocks > BASE + N)
        return NULL;
    return media[nsid] + (slba - BASE) * LBA;
}

static int post(upnvme_cmd_cb cb, void *arg, struct upnvme_buf *buf, int status, uint8_t sct,
                uint8_t sc)
{
    if (pend.live)
        return UPNVME_EAGAIN;
    memset(&pend, 0, sizeof pend);
    pend.live = 1;
    pend.hung = getenv("STUB_HANG") && submitted == 0;
    pend.cb = cb;
    pend.arg = arg;
    pend.cpl.status = status;
    pend.cpl.sct = sct;
    pend.cpl.sc = sc;
    pend.cpl.buf = buf;
    submitted++;
    return UPNVME_OK;
}

const char *upnvme_strerror(int code)
{
    (void)code;
    return "stub";
}

const char *upnvme_last_error(void)
{
    return "stub";
}

int upnvme_ctrl_open(const char *addr, const struct upnvme_ctrl_opts *opts,
                     struct upnvme_ctrl **out)
{
    (void)addr;
    (void)opts;
    *out = &the_ctrl;
    return UPNVME_OK;
}

int upnvme_ctrl_close(struct upnvme_ctrl *ctrl)
{
    (void)ctrl;
    closed = 1;
    return UPNVME_OK;
}

int upnvme_ctrl_get_info_sized(const struct upnvme_ctrl *ctrl, struct upnvme_ctrl_info *info,
                               size_t size)
{
    (void)ctrl;
    struct upnvme_ctrl_info i;
    memset(&i, 0, sizeof i);
    i.oncs = oncs();
    size_t n = size < sizeof i ? size : sizeof i;
    i.size = (uint32_t)n;
    memcpy(info, &i, n);
    return UPNVME_OK;
}

int upnvme_ns_get_info(const struct upnvme_ctrl *ctrl, uint32_t nsid, struct upnvme_ns_info *info)
{
    (void)ctrl;
    if (!has_ns(nsid))
        return UPNVME_EINVAL;
    memset(info, 0, sizeof *info);
    info->nsid = nsid;
    info->lba_size = LBA;
    info->blocks = BASE + N;
    info->size_bytes = (uint64_t)(BASE + N) * LBA;
    return UPNVME_OK;
}

int upnvme_qpair_create(const struct upnvme_ctrl *ctrl, const struct upnvme_qpair_opts *opts,
                        struct upnvme_qpair **out)
{
    (void)ctrl;
    (void)opts;
    *out = &the_qp;
    return UPNVME_OK;
}

int upnvme_buf_alloc(const struct upnvme_ctrl *ctrl, size_t len, struct upnvme_buf **out)
{
    (void)ctrl;
    struct upnvme_buf *b = malloc(sizeof *b);
    b->len = (len + 4095) / 4096 * 4096;
    b->p = calloc(1, b->len);
    *out = b;
    return UPNVME_OK;
}

void *upnvme_buf_data(const struct upnvme_buf *buf)
{
    return buf ? buf->p : NULL;
}

int upnvme_buf_free(struct upnvme_buf *buf)
{
    if (pend.live && pend.cpl.buf == buf)
        return UPNVME_EBUSY;
    if (buf) {
        free(buf->p);
        free(buf);
    }
    return UPNVME_OK;
}

int upnvme_read(struct upnvme_qpair *qp, uint32_t nsid, struct upnvme_buf *buf, uint64_t slba,
                uint32_t blocks, upnvme_cmd_cb cb, void *arg)
{
    (void)qp;
    uint8_t *m = at(nsid, slba, blocks);
    if (!m || !buf || buf->len < (size_t)blocks * LBA)
        return UPNVME_EINVAL;
    memcpy(buf->p, m, (size_t)blocks * LBA);
    return post(cb, arg, buf, UPNVME_OK, 0, 0);
}

int upnvme_write(struct upnvme_qpair *qp, uint32_t nsid, struct upnvme_buf *buf, uint64_t slba,
                 uint32_t blocks, upnvme_cmd_cb cb, void *arg)
{
    (void)qp;
    uint8_t *m = at(nsid, slba, blocks);
    if (!m || !buf || buf->len < (size_t)blocks * LBA)
        return UPNVME_EINVAL;
    memcpy(m, buf->p, (size_t)blocks * LBA);
    return post(cb, arg, buf, UPNVME_OK, 0, 0);
}

int upnvme_compare(struct upnvme_qpair *qp, uint32_t nsid, struct upnvme_buf *buf, uint64_t slba,
                   uint32_t blocks, upnvme_cmd_cb cb, void *arg)
{
    (void)qp;
    if (!(oncs() & UPNVME_ONCS_COMPARE))
        return UPNVME_ENOTSUP;
    uint8_t *m = at(nsid, slba, blocks);
    if (!m || !buf || buf->len < (size_t)blocks * LBA)
        return UPNVME_EINVAL;
    if (memcmp(m, buf->p, (size_t)blocks * LBA) != 0)
        return post(cb, arg, buf, UPNVME_EIO, 2, 0x85);
    return post(cb, arg, buf, UPNVME_OK, 0, 0);
}

int upnvme_verify(struct upnvme_qpair *qp, uint32_t nsid, uint64_t slba, uint32_t blocks,
                  upnvme_cmd_cb cb, void *arg)
{
    (void)qp, (void)nsid, (void)slba, (void)blocks, (void)cb, (void)arg;
    return UPNVME_ENOTSUP;
}

int upnvme_write_uncorrectable(struct upnvme_qpair *qp, uint32_t nsid, uint64_t slba,
                               uint32_t blocks, upnvme_cmd_cb cb, void *arg)
{
    (void)qp, (void)nsid, (void)slba, (void)blocks, (void)cb, (void)arg;
    return UPNVME_ENOTSUP;
}

int upnvme_copy(struct upnvme_qpair *qp, uint32_t nsid, uint64_t sdlba,
                const struct upnvme_copy_range *ranges, uint32_t count, upnvme_cmd_cb cb,
                void *arg)
{
    (void)qp;
    if (!(oncs() & UPNVME_ONCS_COPY))
        return UPNVME_ENOTSUP;
    uint8_t tmp[N * LBA];
    size_t off = 0;
    for (uint32_t i = 0; i < count; i++) {
        uint32_t s = ranges[i].snsid ? ranges[i].snsid : nsid;
        if (s != nsid)
            return UPNVME_ENOTSUP; /* no cross-namespace formats enabled */
        uint8_t *m = at(s, ranges[i].slba, ranges[i].blocks);
        if (!m || off + (size_t)ranges[i].blocks * LBA > sizeof tmp)
            return UPNVME_EINVAL;
        memcpy(tmp + off, m, (size_t)ranges[i].blocks * LBA);
        off += (size_t)ranges[i].blocks * LBA;
    }
    uint8_t *d = at(nsid, sdlba, off / LBA);
    if (!d)
        return UPNVME_EINVAL;
    memcpy(d, tmp, off);
    return post(cb, arg, NULL, UPNVME_OK, 0, 0);
}

/* A raw Read (02h: SLBA in CDW10-11, 0-based NLB in CDW12 15:0) moves
 * data; any other opcode completes with Invalid Command Opcode (0h/01h). */
int upnvme_io_passthru(struct upnvme_qpair *qp, const struct upnvme_io_cmd *cmd,
                       struct upnvme_buf *buf, size_t data_len, upnvme_cmd_cb cb, void *arg)
{
    (void)qp;
    if (!cmd || (data_len != 0) != (buf != NULL))
        return UPNVME_EINVAL;
    if (cmd->opcode != 0x02)
        return post(cb, arg, buf, UPNVME_EIO, 0, 0x01);
    uint64_t slba = (uint64_t)cmd->cdw11 << 32 | cmd->cdw10;
    uint32_t blocks = (cmd->cdw12 & 0xffff) + 1;
    uint8_t *m = at(cmd->nsid, slba, blocks);
    if (!m || !buf || data_len < (size_t)blocks * LBA || buf->len < data_len)
        return UPNVME_EINVAL;
    memcpy(buf->p, m, (size_t)blocks * LBA);
    return post(cb, arg, buf, UPNVME_OK, 0, 0);
}

int upnvme_qpair_process_completions(struct upnvme_qpair *qp, uint32_t max)
{
    (void)qp;
    (void)max;
    if (!pend.live || pend.hung)
        return 0;
    pend.live = 0;
    if (pend.cb)
        pend.cb(pend.arg, &pend.cpl);
    return 1;
}

int upnvme_qpair_destroy(struct upnvme_qpair *qp)
{
    (void)qp;
    if (!pend.live)
        return UPNVME_OK;
    if (!closed)
        return UPNVME_EBUSY;
    /* Called from the example's main: the stack below main's stack pointer
     * at this call (this frame's address + 16: the return address and the
     * saved frame pointer) belongs to frames that have returned. */
    char *live = (char *)__builtin_frame_address(0) + 16;
    char *a = pend.arg;
    if (a && a < live && a > live - (1 << 20)) {
        fprintf(stderr, "stub: the callback argument %p is in a stack frame that has returned\n",
                pend.arg);
        exit(99);
    }
    pend.live = 0;
    pend.cpl.status = UPNVME_ENODEV;
    if (pend.cb)
        pend.cb(pend.arg, &pend.cpl);
    return UPNVME_OK;
}
