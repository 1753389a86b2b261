/* emu.cc — the emulator's scheduler: a kernel's block runs as one fiber per CUDA thread on
 * the calling thread; a fiber runs until it waits at a barrier (__syncthreads, a warp
 * shuffle, an mma) or returns, then the next one runs. Blocks run one after another.
 * A fiber starts on its own stack by makecontext/setcontext (one signal-mask syscall) and
 * every switch after that is _setjmp/_longjmp, which leave the signal mask alone
 * (swapcontext makes a syscall each time: 7 million of them in test_cuda_backend_emu).
 * A barrier that can never complete (threads of a block waiting at different barriers, or
 * a warp's lanes split by a divergent shuffle) is reported and aborts, as it would hang a
 * GPU. */
#undef _FORTIFY_SOURCE /* __longjmp_chk refuses jumps between stacks */
#include <setjmp.h>
#include <ucontext.h>

#include <cstdio>
#include <cstdlib>

#include "cuda_runtime.h"

dim3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
emu_block *emu_cur;
std::mutex emu_atomic_mu;
unsigned *emu_mma_calls;

namespace {

struct fiber {
    ucontext_t ctx; /* only to start it */
    jmp_buf jb;     /* where it waits */
    int started, done;
    unsigned mma_calls;
};

const size_t STACK_BYTES = 256 << 10; /* kernels keep small arrays; the mma emulation ~4 KB */
ucontext_t start_tmpl;                /* getcontext once; each fiber's start context is a copy */
int have_tmpl;
jmp_buf sched_jb; /* the scheduler, set before each switch into a fiber */
std::vector<fiber> fibers;
std::vector<char *> stacks;
int cur;
unsigned long progress; /* barrier arrivals and returns: a round without any is a deadlock */
const std::function<void()> *kernel;

void yield() {
    if (!_setjmp(fibers[cur].jb))
        _longjmp(sched_jb, 1);
}

void trampoline() {
    (*kernel)();
    unsigned t = threadIdx.x;
    emu_cur->warp_bar[t >> 5]->arrive_and_drop();
    emu_cur->block_bar->arrive_and_drop();
    fibers[cur].done = 1;
    progress++;
    _longjmp(sched_jb, 1); /* never returns: its stack is reused by the next block */
}

} // namespace

void emu_bar::arrive_and_wait() {
    unsigned g = gen;
    progress++;
    if (++arrived >= expected) {
        arrived = 0;
        gen++;
        return;
    }
    while (gen == g)
        yield();
}

void emu_bar::arrive_and_drop() {
    expected--;
    if (arrived > 0 && arrived >= expected) {
        arrived = 0;
        gen++;
    }
}

void emu_launch(dim3 grid, dim3 block, std::function<void()> f) {
    gridDim = grid;
    blockDim = block;
    unsigned nt = block.x, nw = (nt + 31) / 32;
    kernel = &f;
    fibers.assign(nt, fiber{});
    while (stacks.size() < nt)
        stacks.push_back((char *)malloc(STACK_BYTES));
    if (!have_tmpl) {
        getcontext(&start_tmpl);
        start_tmpl.uc_link = nullptr; /* trampoline never returns */
        have_tmpl = 1;
    }
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                emu_block b;
                emu_bar block_bar;
                block_bar.expected = (int)nt;
                b.block_bar = &block_bar;
                std::vector<emu_bar> warp_bars(nw);
                for (unsigned w = 0; w < nw; w++) {
                    warp_bars[w].expected = (int)(nt - 32 * w < 32 ? nt - 32 * w : 32);
                    b.warp_bar.push_back(&warp_bars[w]);
                    b.warp_buf.push_back(std::vector<uint64_t>(32));
                    b.warp_mma.push_back(std::vector<int>(2 * 32 * 8));
                }
                emu_cur = &b;
                blockIdx = dim3(x, y, z);
                for (unsigned t = 0; t < nt; t++) {
                    fiber &fb = fibers[t];
                    fb.started = fb.done = 0;
                    fb.mma_calls = 0;
                    fb.ctx = start_tmpl;
                    fb.ctx.uc_stack.ss_sp = stacks[t];
                    fb.ctx.uc_stack.ss_size = STACK_BYTES;
                    makecontext(&fb.ctx, trampoline, 0);
                }
                unsigned live = nt;
                while (live) {
                    unsigned long before = progress;
                    for (unsigned t = 0; t < nt; t++) {
                        if (fibers[t].done)
                            continue;
                        cur = (int)t;
                        threadIdx = dim3(t, 0, 0);
                        emu_mma_calls = &fibers[t].mma_calls;
                        if (!_setjmp(sched_jb)) {
                            if (!fibers[t].started) {
                                fibers[t].started = 1;
                                setcontext(&fibers[t].ctx);
                            }
                            _longjmp(fibers[t].jb, 1);
                        }
                        if (fibers[t].done)
                            live--;
                    }
                    if (live && progress == before) {
                        fprintf(stderr,
                                "emu: deadlock in block (%u,%u,%u) of a %u-thread kernel: %u "
                                "threads wait at barriers that cannot complete\n",
                                x, y, z, nt, live);
                        abort();
                    }
                }
            }
}
