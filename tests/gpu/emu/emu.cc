#include "cuda_runtime.h"
thread_local dim3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
emu_block *emu_cur;
std::mutex emu_atomic_mu;
void emu_launch(dim3 grid, dim3 block, std::function<void()> f) {
    gridDim = grid;
    blockDim = block;
    unsigned nt = block.x;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                emu_block b;
                b.block_bar = new std::barrier<>(nt);
                unsigned nw = (nt + 31) / 32;
                for (unsigned w = 0; w < nw; w++) {
                    b.warp_bar.push_back(new std::barrier<>(32));
                    b.warp_buf.push_back(std::vector<uint64_t>(32));
                    b.warp_mma.push_back(std::vector<int>(2 * 32 * 8));
                }
                emu_cur = &b;
                std::vector<std::thread> th;
                for (unsigned t = 0; t < nt; t++)
                    th.emplace_back([&, t, x, y, z] {
                        threadIdx = dim3(t, 0, 0);
                        blockIdx = dim3(x, y, z);
                        f();
                        b.warp_bar[t >> 5]->arrive_and_drop();
                        b.block_bar->arrive_and_drop();
                    });
                for (auto &t : th)
                    t.join();
                delete b.block_bar;
                for (auto *p : b.warp_bar)
                    delete p;
            }
}
