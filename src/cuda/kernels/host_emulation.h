// Host emulation of the little of CUDA the kernels use, for testing them without a
// GPU (tests/python/test_cuda_ptx.py). Not used by the PTX build: a .cu file is
// compiled as C++ with
//
//   g++ -std=c++17 -O1 -ffp-contract=off -fPIC -shared -pthread \
//       -DNDX_HOST_EMULATION -include host_emulation.h -x c++ X.cu -o X.so
//
// (one translation unit per library) and every thread of a launch is an OS thread that calls ndx_emu_set_thread and
// then the kernel function. Warp intrinsics synchronise the 32 lanes of a warp
// through a barrier, so code that is not warp-convergent deadlocks here as it would
// misbehave on a GPU. x86-64 float arithmetic without contraction is IEEE like the
// GPU's with --fmad=false; float16 conversions use _Float16.

#ifndef NDX_HOST_EMULATION_H
#define NDX_HOST_EMULATION_H

#include <condition_variable>
#include <cmath>
#include <cstring>
#include <mutex>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))

struct ndx_emu_dim3 {
    unsigned x, y, z;
};
inline thread_local ndx_emu_dim3 threadIdx = {0, 0, 0};
inline thread_local ndx_emu_dim3 blockIdx = {0, 0, 0};
inline ndx_emu_dim3 blockDim = {1, 1, 1};
inline ndx_emu_dim3 gridDim = {1, 1, 1};

// A reusable barrier for the 32 lanes of one warp, with a word per lane to exchange.
struct ndx_emu_warp {
    std::mutex m;
    std::condition_variable cv;
    unsigned arrived = 0;
    unsigned long long generation = 0;
    unsigned long long slot[32];
    void wait() {
        std::unique_lock<std::mutex> lock(m);
        const unsigned long long gen = generation;
        if (++arrived == 32) {
            arrived = 0;
            generation++;
            cv.notify_all();
        } else {
            cv.wait(lock, [&] { return generation != gen; });
        }
    }
};
// Never destroyed: the emulated driver drains its streams at exit, after the static
// destructors of this (later loaded) module have run, so a launch still queued then
// must find its warps' list alive.
inline std::vector<ndx_emu_warp*>& ndx_emu_warps = *new std::vector<ndx_emu_warp*>();

inline ndx_emu_warp& ndx_emu_my_warp() {
    const unsigned long long t = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    return *ndx_emu_warps[t / 32];
}

extern "C" __attribute__((used)) void ndx_emu_begin(unsigned grid, unsigned block) {
    for (ndx_emu_warp* w : ndx_emu_warps) delete w;
    ndx_emu_warps.clear();
    gridDim = {grid, 1, 1};
    blockDim = {block, 1, 1};
    for (unsigned long long i = 0; i < (unsigned long long)grid * block / 32; ++i) {
        ndx_emu_warps.push_back(new ndx_emu_warp());
    }
}

extern "C" __attribute__((used)) void ndx_emu_set_thread(unsigned block, unsigned thread) {
    blockIdx = {block, 0, 0};
    threadIdx = {thread, 0, 0};
}

template <class T>
inline T __shfl_down_sync(unsigned, T v, int delta) {
    static_assert(sizeof(T) <= 8, "one word per lane");
    ndx_emu_warp& w = ndx_emu_my_warp();
    const unsigned lane = threadIdx.x & 31u;
    unsigned long long bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    w.slot[lane] = bits;
    w.wait();
    T out = v;
    if (lane + delta < 32) {
        bits = w.slot[lane + delta];
        std::memcpy(&out, &bits, sizeof(T));
    }
    w.wait();
    return out;
}

inline bool __any_sync(unsigned, bool pred) {
    ndx_emu_warp& w = ndx_emu_my_warp();
    w.slot[threadIdx.x & 31u] = pred ? 1 : 0;
    w.wait();
    bool any = false;
    for (int i = 0; i < 32; ++i) any = any || w.slot[i] != 0;
    w.wait();
    return any;
}

inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
    return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
inline unsigned long long atomicMin(unsigned long long* p, unsigned long long v) {
    unsigned long long old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (v < old && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST,
                                                   __ATOMIC_SEQ_CST)) {
    }
    return old;
}

inline unsigned __float_as_uint(float f) {
    unsigned u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// The three conversions ndx_common.cuh writes in inline PTX.
inline float ndx_emu_f16_to_f32(unsigned short h) {
    _Float16 x;
    std::memcpy(&x, &h, 2);
    return (float)x;
}
inline unsigned short ndx_emu_f32_to_f16(float f) {
    _Float16 x = (_Float16)f;  // to nearest even
    unsigned short h;
    std::memcpy(&h, &x, 2);
    return h;
}
// cvt.rz.f32.f64: toward zero.
inline float ndx_emu_f64_to_f32_rz(double v) {
    float t = (float)v;
    if (v == v && std::fabs((double)t) > std::fabs(v)) {
        unsigned u = __float_as_uint(t) - 1u;  // one step toward zero (inf -> FLT_MAX)
        t = __uint_as_float(u);
    }
    return t;
}

#endif  // NDX_HOST_EMULATION_H
