/* emu.cc — the emulator's scheduler: a kernel's block runs as one fiber per CUDA thread on
 * the calling thread; a fiber runs until it waits at a barrier (__syncthreads, a warp
 * shuffle, an mma) or returns, then the next one runs. Blocks run one after another.
 * A fiber waiting at a barrier is not resumed until the barrier completes (the scheduler
 * compares the barrier's generation with the one it waits on), so each wait costs one
 * switch out and one back. On x86-64 a switch is emu_swap (below: the callee-saved
 * registers pushed, the stack pointer exchanged, popped); glibc's _longjmp, used before,
 * walks the thread's cleanup handlers at every jump and took a quarter of the run
 * (perf, test_cuda_graphs_emu). Elsewhere fibers start by makecontext/setcontext and switch
 * by _setjmp/_longjmp, which leave the signal mask alone (swapcontext makes a syscall each
 * time). A barrier that can never complete (threads of a block waiting at different
 * barriers, or a warp's lanes split by a divergent shuffle) is reported and aborts, as it
 * would hang a GPU. Under AddressSanitizer every switch is announced to it
 * (__sanitizer_start_switch_fiber / __sanitizer_finish_switch_fiber), so it knows which
 * stack runs and checks the kernels' own arrays on the fibers' stacks.
 * MEDLEY_EMU_ORDER picks the order in which runnable fibers resume in each round:
 * "forward" (thread 0 first, the default), "reverse", or "random[:SEED]" (a new
 * permutation every round). A kernel that reads what another thread wrote without a
 * barrier between (a race on a GPU) gets its right answer in one order and not in another,
 * so the tests run in all three (tests/cuda_emu*.cmake). */
#undef _FORTIFY_SOURCE /* __longjmp_chk refuses jumps between stacks */
#include <setjmp.h>
#include <ucontext.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cuda_runtime.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define ASAN_START(fake, bottom, size) __sanitizer_start_switch_fiber(fake, bottom, size)
#define ASAN_FINISH(fake, bottom, size) __sanitizer_finish_switch_fiber(fake, bottom, size)
/* a stack about to be reused: the redzones of the frame its last fiber never left
 * (trampoline's, at the top) are cleared */
#define ASAN_FRESH_STACK(stack, bytes)                                                             \
    ASAN_UNPOISON_MEMORY_REGION((stack) + (bytes) - (16 << 10), 16 << 10)
#else
#define ASAN_FRESH_STACK(stack, bytes) ((void)0)
#define ASAN_START(fake, bottom, size) ((void)0)
#define ASAN_FINISH(fake, bottom, size) ((void)0)
#endif

dim3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
emu_block *emu_cur;
std::mutex emu_atomic_mu;
unsigned *emu_mma_calls;
unsigned *emu_shfl_calls;

#if defined(__x86_64__)
/* emu_swap(save, to): push rbp, rbx, r12-r15, store the stack pointer in *save, load `to`,
 * pop them and return on that stack. A fresh fiber's stack holds six zero registers and
 * the entry address (fiber_stack). MXCSR and the x87 control word are not switched: no
 * kernel changes them. */
extern "C" void emu_swap(void **save, void *to);
asm(".text\n"
    ".globl emu_swap\n"
    ".type emu_swap,@function\n"
    "emu_swap:\n"
    "  pushq %rbp\n"
    "  pushq %rbx\n"
    "  pushq %r12\n"
    "  pushq %r13\n"
    "  pushq %r14\n"
    "  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n"
    "  popq %r14\n"
    "  popq %r13\n"
    "  popq %r12\n"
    "  popq %rbx\n"
    "  popq %rbp\n"
    "  ret\n"
    ".size emu_swap,.-emu_swap\n");
#define EMU_SWAP 1
#endif

namespace {

struct fiber {
#if EMU_SWAP
    void *sp; /* where it waits (or, before it started, its fresh stack) */
#else
    ucontext_t ctx; /* only to start it */
    jmp_buf jb;     /* where it waits */
    int started;
#endif
    int done;
    const emu_bar *wait; /* the barrier it waits at, NULL when runnable */
    unsigned wait_gen;   /* that barrier's generation when it arrived */
    unsigned mma_calls, shfl_calls;
    void *asan_fake; /* AddressSanitizer's fake stack of the fiber while it is switched out */
};

const size_t STACK_BYTES = 256 << 10; /* kernels keep small arrays; the mma emulation ~4 KB */
#if EMU_SWAP
void *sched_sp; /* the scheduler's stack pointer while a fiber runs */
#else
ucontext_t start_tmpl; /* getcontext once; each fiber's start context is a copy */
int have_tmpl;
jmp_buf sched_jb; /* the scheduler, set before each switch into a fiber */
#endif
std::vector<fiber> fibers;
/* the fibers' stacks, kept from launch to launch; freed at exit */
struct stack_list : std::vector<char *> {
    ~stack_list() {
        for (char *p : *this)
            free(p);
    }
} stacks;
int cur;
/* AddressSanitizer's view of the scheduler: its stack (told by the first switch into a
 * fiber) and its fake stack while a fiber runs */
const void *sched_stack_bottom;
size_t sched_stack_size;
void *sched_asan_fake;
unsigned long progress; /* barrier arrivals and returns: a round without any is a deadlock */
const std::function<void()> *kernel;

/* MEDLEY_EMU_ORDER: 0 forward, 1 reverse, 2 random (xorshift from the seed) */
int order_mode = -1;
uint64_t order_rng = 0x9e3779b97f4a7c15ull;
std::vector<unsigned> order;

void order_init() {
    const char *v = getenv("MEDLEY_EMU_ORDER");
    order_mode = 0;
    if (!v || !*v || !strcmp(v, "forward"))
        return;
    if (!strcmp(v, "reverse")) {
        order_mode = 1;
    } else if (!strncmp(v, "random", 6) && (v[6] == 0 || v[6] == ':')) {
        order_mode = 2;
        if (v[6] == ':')
            order_rng = strtoull(v + 7, nullptr, 10) * 0x9e3779b97f4a7c15ull + 1;
    } else {
        fprintf(stderr, "emu: MEDLEY_EMU_ORDER=%s: forward, reverse or random[:SEED]\n", v);
        abort();
    }
}

/* the order of this round over nt fibers */
void order_round(unsigned nt) {
    if (order.size() != nt) {
        order.resize(nt);
        for (unsigned i = 0; i < nt; i++)
            order[i] = order_mode == 1 ? nt - 1 - i : i;
    }
    if (order_mode == 2)
        for (unsigned i = nt - 1; i > 0; i--) { /* Fisher-Yates */
            order_rng ^= order_rng << 13;
            order_rng ^= order_rng >> 7;
            order_rng ^= order_rng << 17;
            unsigned j = (unsigned)(order_rng % (i + 1));
            unsigned x = order[i];
            order[i] = order[j];
            order[j] = x;
        }
}

void yield() {
    ASAN_START(&fibers[cur].asan_fake, sched_stack_bottom, sched_stack_size);
#if EMU_SWAP
    emu_swap(&fibers[cur].sp, sched_sp);
#else
    if (!_setjmp(fibers[cur].jb))
        _longjmp(sched_jb, 1);
#endif
    ASAN_FINISH(fibers[cur].asan_fake, &sched_stack_bottom, &sched_stack_size);
}

void trampoline() {
    ASAN_FINISH(nullptr, &sched_stack_bottom, &sched_stack_size);
    (*kernel)();
    unsigned t = threadIdx.x;
    emu_cur->warp_bar[t >> 5]->arrive_and_drop();
    emu_cur->block_bar->arrive_and_drop();
    fibers[cur].done = 1;
    progress++;
    ASAN_START(nullptr, sched_stack_bottom, sched_stack_size); /* its fake stack goes */
#if EMU_SWAP
    void *dead;
    emu_swap(&dead, sched_sp); /* never returns: its stack is reused by the next block */
#else
    _longjmp(sched_jb, 1);
#endif
    abort();
}

#if EMU_SWAP
/* The stack pointer of fiber t that starts in trampoline: 16-byte aligned below the top,
 * six registers, the entry address, and a null return address for trampoline's frame (it
 * sees the stack as a called function does: rsp = 8 mod 16). The stacks are page-aligned,
 * so their tops would all fall in the same cache sets; fiber t's starts (t mod 64) lines
 * lower, spreading them over the sets. */
void *fiber_stack(char *stack, unsigned t) {
    uintptr_t top = ((uintptr_t)stack + STACK_BYTES - (t % 64) * 64) & ~(uintptr_t)15;
    void **sp = (void **)(top - 64);
    for (int i = 0; i < 6; i++)
        sp[i] = nullptr;
    sp[6] = (void *)trampoline;
    sp[7] = nullptr;
    return sp;
}
#endif

} // namespace

void emu_bar::arrive_and_wait() {
    unsigned g = gen;
    progress++;
    if (++arrived >= expected) {
        arrived = 0;
        gen++;
        return;
    }
    fiber &f = fibers[cur];
    f.wait = this;
    f.wait_gen = g;
    yield(); /* resumed once gen moved on */
    fibers[cur].wait = nullptr;
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
    if (order_mode < 0)
        order_init();
    order.clear();
    fibers.assign(nt, fiber{});
    while (stacks.size() < nt)
        stacks.push_back((char *)malloc(STACK_BYTES));
#if !EMU_SWAP
    if (!have_tmpl) {
        getcontext(&start_tmpl);
        start_tmpl.uc_link = nullptr; /* trampoline never returns */
        have_tmpl = 1;
    }
#endif
    /* one block's synchronisation state, reset for each block */
    emu_block b;
    emu_bar block_bar;
    std::vector<emu_bar> warp_bars(nw);
    b.block_bar = &block_bar;
    for (unsigned w = 0; w < nw; w++) {
        b.warp_bar.push_back(&warp_bars[w]);
        b.warp_buf.push_back(std::vector<uint64_t>(2 * 32));
        b.warp_mma.push_back(std::vector<int>(2 * 32 * 8));
    }
    emu_cur = &b;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                block_bar = emu_bar{};
                block_bar.expected = (int)nt;
                for (unsigned w = 0; w < nw; w++) {
                    warp_bars[w] = emu_bar{};
                    warp_bars[w].expected = (int)(nt - 32 * w < 32 ? nt - 32 * w : 32);
                }
                b.or_acc.store(0);
                blockIdx = dim3(x, y, z);
                for (unsigned t = 0; t < nt; t++) {
                    fiber &fb = fibers[t];
                    fb.done = 0;
                    fb.wait = nullptr;
                    fb.mma_calls = fb.shfl_calls = 0;
                    ASAN_FRESH_STACK(stacks[t], STACK_BYTES);
#if EMU_SWAP
                    fb.sp = fiber_stack(stacks[t], t);
#else
                    fb.started = 0;
                    fb.ctx = start_tmpl;
                    fb.ctx.uc_stack.ss_sp = stacks[t];
                    fb.ctx.uc_stack.ss_size = STACK_BYTES;
                    makecontext(&fb.ctx, trampoline, 0);
#endif
                }
                unsigned live = nt;
                while (live) {
                    unsigned long before = progress;
                    if (order_mode)
                        order_round(nt);
                    for (unsigned i = 0; i < nt; i++) {
                        unsigned t = order_mode ? order[i] : i;
                        fiber &fb = fibers[t];
                        if (fb.done || (fb.wait && fb.wait->gen == fb.wait_gen))
                            continue;
                        cur = (int)t;
                        threadIdx = dim3(t, 0, 0);
                        emu_mma_calls = &fb.mma_calls;
                        emu_shfl_calls = &fb.shfl_calls;
                        ASAN_START(&sched_asan_fake, stacks[t], STACK_BYTES);
#if EMU_SWAP
                        emu_swap(&sched_sp, fb.sp);
#else
                        if (!_setjmp(sched_jb)) {
                            if (!fb.started) {
                                fb.started = 1;
                                setcontext(&fb.ctx);
                            }
                            _longjmp(fb.jb, 1);
                        }
#endif
                        ASAN_FINISH(sched_asan_fake, nullptr, nullptr);
                        if (fb.done)
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
