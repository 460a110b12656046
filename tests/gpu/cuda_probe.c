/*
 * cuda_probe: what a CUDA program sees of its GPUs, run inside a container.
 *
 * `make gpu-check` runs this on a machine with a real NVIDIA GPU, in a container
 * that runc makes from a claim's CDI spec: the spec's device nodes, driver
 * libraries and hooks are all the container has of the driver. The probe does
 * what a CUDA application does first (dlopen `libcuda.so.1`, cuInit, enumerate
 * the devices) and then runs a small kernel, so a spec that mounts the wrong
 * library, leaves out a node or injects another claim's GPU shows up here. The
 * fake driver root of tests/fake-nvml answers the same calls in CI, without the
 * kernel (a fake cannot run PTX).
 *
 * Output: one fact per line on stdout, the first word the key, so the caller
 * can parse it:
 *
 *   cuda init=<rc> version=<cuDriverGetVersion> count=<n> lib=<file of cuInit>
 *   cuda dlopen-failed <dlerror>          (then nothing but "probe done")
 *   cuda missing-symbols <names>          (likewise)
 *   device <i> uuid=GPU-<8>-<4>-<4>-<4>-<12> name=<name, spaces as _>
 *   device <i> fail <call> <rc> <error name>
 *   device missing-symbols <names>
 *   kernel ok n=<N>
 *   kernel fail <step> <rc> <error name>  (a wrong result: step "check",
 *                                           rc the index, then got/want)
 *   kernel skipped <why>
 *   probe done
 *
 * The exit status is 0 whenever the findings were printed, whatever they say;
 * 2 for misuse (arguments).
 *
 * Build: cc -O1 -o probe cuda_probe.c -ldl (glibc; no CUDA headers needed).
 *
 * Driver API, as the CUDA Driver API reference documents it
 * (https://docs.nvidia.com/cuda/cuda-driver-api/, sections Initialization,
 * Version Management, Device Management, Primary Context Management, Context
 * Management, Module Management, Memory Management, Execution Control, Error
 * Handling). cuda.h maps several names to versioned entry points (`#define
 * cuMemAlloc cuMemAlloc_v2`, `cuMemcpyDtoH` -> `cuMemcpyDtoH_v2`, `cuMemFree`
 * -> `cuMemFree_v2`, `cuDevicePrimaryCtxRelease` ->
 * `cuDevicePrimaryCtxRelease_v2`); a program that resolves symbols itself must
 * ask for the versioned ones, since the unversioned memory calls are the old
 * 32-bit-CUdeviceptr ABI. The primary context is used rather than cuCtxCreate,
 * whose entry point and arguments changed in CUDA 13 (cuCtxCreate_v4 with a
 * CUctxCreateParams).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

/* The cuda.h types this probe needs, declared here (no toolkit on the node). */
typedef int CUresult; /* CUDA_SUCCESS is 0 */
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef unsigned long long CUdeviceptr; /* CUdeviceptr_v2 on 64-bit */
typedef struct {
    unsigned char bytes[16]; /* cuda.h: char bytes[16] */
} CUuuid;

/* Elements the kernel writes, threads per block, and blocks launched: one block
 * more than the elements need, so the kernel's bounds check has threads to stop. */
#define N 256u
#define BLOCK 128u
#define GRID ((N + BLOCK - 1) / BLOCK + 1)

/*
 * out[i] = i*i + 7 for i < n, one thread per element. PTX ISA
 * (https://docs.nvidia.com/cuda/parallel-thread-execution/): ISA 7.0 (CUDA
 * 11.0) for sm_70, 64-bit addresses; the driver JIT-compiles PTX for the GPU it
 * runs on, newer ones included. The parameters are a generic pointer (a
 * CUdeviceptr, turned into a global-space address with cvta.to.global) and a
 * u32; cuLaunchKernel reads their sizes from the image. The global index is
 * ctaid.x * ntid.x + tid.x (mad.lo), threads at or past n branch to the end,
 * the byte offset is the index widened to 64 bits times 4 (mul.wide.u32).
 */
static const char ptx[] =
    ".version 7.0\n"
    ".target sm_70\n"
    ".address_size 64\n"
    "\n"
    ".visible .entry topodra_squares(\n"
    "    .param .u64 topodra_squares_out,\n"
    "    .param .u32 topodra_squares_n\n"
    ")\n"
    "{\n"
    "    .reg .pred %p<2>;\n"
    "    .reg .b32 %r<8>;\n"
    "    .reg .b64 %rd<5>;\n"
    "\n"
    "    ld.param.u64 %rd1, [topodra_squares_out];\n"
    "    ld.param.u32 %r1, [topodra_squares_n];\n"
    "    cvta.to.global.u64 %rd2, %rd1;\n"
    "    mov.u32 %r2, %ctaid.x;\n"
    "    mov.u32 %r3, %ntid.x;\n"
    "    mov.u32 %r4, %tid.x;\n"
    "    mad.lo.s32 %r5, %r2, %r3, %r4;\n"
    "    setp.ge.u32 %p1, %r5, %r1;\n"
    "    @%p1 bra DONE;\n"
    "    mul.lo.s32 %r6, %r5, %r5;\n"
    "    add.s32 %r7, %r6, 7;\n"
    "    mul.wide.u32 %rd3, %r5, 4;\n"
    "    add.s64 %rd4, %rd2, %rd3;\n"
    "    st.global.u32 [%rd4], %r7;\n"
    "DONE:\n"
    "    ret;\n"
    "}\n";

static void *lib;

static CUresult (*p_cuGetErrorName)(CUresult, const char **);

static const char *errname(CUresult rc) {
    const char *s = NULL;
    if (p_cuGetErrorName && p_cuGetErrorName(rc, &s) == 0 && s)
        return s;
    return "unknown";
}

/* dlsym `name`, else `fallback` (may be NULL); on failure appends `name` to
 * `missing`. */
static void *sym(const char *name, const char *fallback, char *missing, size_t cap) {
    void *p = dlsym(lib, name);
    if (!p && fallback)
        p = dlsym(lib, fallback);
    if (!p) {
        size_t len = strlen(missing);
        snprintf(missing + len, cap - len, " %s", name);
    }
    return p;
}

static void uuid_text(const CUuuid *u, char out[41]) {
    const unsigned char *b = u->bytes;
    /* nvidia-smi's form: GPU-, then the 16 bytes in order, grouped 4-2-2-2-6. */
    snprintf(out, 41,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11],
             b[12], b[13], b[14], b[15]);
}

static void devices(int count) {
    char missing[256] = "";
    CUresult (*get)(CUdevice *, int) = sym("cuDeviceGet", NULL, missing, sizeof missing);
    CUresult (*name)(char *, int, CUdevice) =
        sym("cuDeviceGetName", NULL, missing, sizeof missing);
    /* _v2 answers the MIG UUID for a MIG device; the old one the GPU's. */
    CUresult (*uuid)(CUuuid *, CUdevice) =
        sym("cuDeviceGetUuid_v2", "cuDeviceGetUuid", missing, sizeof missing);
    if (missing[0]) {
        printf("device missing-symbols%s\n", missing);
        return;
    }
    for (int i = 0; i < count; i++) {
        CUdevice dev = -1;
        CUuuid u;
        char text[41], buf[256];
        CUresult rc = get(&dev, i);
        if (rc != 0) {
            printf("device %d fail cuDeviceGet %d %s\n", i, rc, errname(rc));
            continue;
        }
        memset(&u, 0, sizeof u);
        rc = uuid(&u, dev);
        if (rc != 0) {
            printf("device %d fail cuDeviceGetUuid %d %s\n", i, rc, errname(rc));
            continue;
        }
        memset(buf, 0, sizeof buf);
        rc = name(buf, (int)sizeof buf - 1, dev);
        if (rc != 0) {
            printf("device %d fail cuDeviceGetName %d %s\n", i, rc, errname(rc));
            continue;
        }
        for (char *c = buf; *c; c++)
            if (*c == ' ' || *c == '\t' || *c == '\n')
                *c = '_';
        uuid_text(&u, text);
        printf("device %d uuid=%s name=%s\n", i, text, buf);
    }
}

/* Loads the PTX on device 0's primary context, runs it, checks every element. */
static void kernel(int count) {
    char missing[512] = "";
    CUresult (*get)(CUdevice *, int) = sym("cuDeviceGet", NULL, missing, sizeof missing);
    CUresult (*retain)(CUcontext *, CUdevice) =
        sym("cuDevicePrimaryCtxRetain", NULL, missing, sizeof missing);
    CUresult (*release)(CUdevice) = sym("cuDevicePrimaryCtxRelease_v2",
                                        "cuDevicePrimaryCtxRelease", missing, sizeof missing);
    CUresult (*set_current)(CUcontext) = sym("cuCtxSetCurrent", NULL, missing, sizeof missing);
    CUresult (*load)(CUmodule *, const void *) =
        sym("cuModuleLoadData", NULL, missing, sizeof missing);
    CUresult (*function)(CUfunction *, CUmodule, const char *) =
        sym("cuModuleGetFunction", NULL, missing, sizeof missing);
    CUresult (*unload)(CUmodule) = sym("cuModuleUnload", NULL, missing, sizeof missing);
    CUresult (*alloc)(CUdeviceptr *, size_t) = sym("cuMemAlloc_v2", NULL, missing, sizeof missing);
    CUresult (*mfree)(CUdeviceptr) = sym("cuMemFree_v2", NULL, missing, sizeof missing);
    CUresult (*dtoh)(void *, CUdeviceptr, size_t) =
        sym("cuMemcpyDtoH_v2", NULL, missing, sizeof missing);
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       unsigned, CUstream, void **, void **) =
        sym("cuLaunchKernel", NULL, missing, sizeof missing);
    CUresult (*sync)(void) = sym("cuCtxSynchronize", NULL, missing, sizeof missing);
    if (missing[0]) {
        printf("kernel skipped missing-symbols%s\n", missing);
        return;
    }
    if (count < 1) {
        printf("kernel skipped no-device\n");
        return;
    }

    CUdevice dev = -1;
    CUcontext ctx = NULL;
    CUmodule mod = NULL;
    CUfunction fn = NULL;
    CUdeviceptr out = 0;
    unsigned int n = N, host[N];
    int retained = 0, checked = 0;
    const char *step = "cuDeviceGet";
    CUresult rc = get(&dev, 0);
    if (rc != 0)
        goto done;
    step = "cuDevicePrimaryCtxRetain";
    if ((rc = retain(&ctx, dev)) != 0)
        goto done;
    retained = 1;
    step = "cuCtxSetCurrent";
    if ((rc = set_current(ctx)) != 0)
        goto done;
    step = "cuModuleLoadData"; /* PTX: a NUL-terminated string, JIT-compiled */
    if ((rc = load(&mod, ptx)) != 0)
        goto done;
    step = "cuModuleGetFunction";
    if ((rc = function(&fn, mod, "topodra_squares")) != 0)
        goto done;
    step = "cuMemAlloc";
    if ((rc = alloc(&out, sizeof host)) != 0)
        goto done;
    {
        /* cuLaunchKernel: one pointer per kernel parameter, each to the value. */
        void *args[] = {&out, &n};
        step = "cuLaunchKernel";
        if ((rc = launch(fn, GRID, 1, 1, BLOCK, 1, 1, 0, NULL, args, NULL)) != 0)
            goto done;
    }
    step = "cuCtxSynchronize"; /* launch errors surface here */
    if ((rc = sync()) != 0)
        goto done;
    step = "cuMemcpyDtoH";
    memset(host, 0, sizeof host);
    if ((rc = dtoh(host, out, sizeof host)) != 0)
        goto done;
    checked = 1;
    for (unsigned int i = 0; i < N; i++) {
        unsigned int want = i * i + 7u;
        if (host[i] != want) {
            printf("kernel fail check %u got=%u want=%u\n", i, host[i], want);
            goto done;
        }
    }
    printf("kernel ok n=%u\n", N);
done:
    if (rc != 0 && !checked)
        printf("kernel fail %s %d %s\n", step, rc, errname(rc));
    if (out)
        mfree(out);
    if (mod)
        unload(mod);
    if (retained) {
        /* Releasing does not unbind the context from this thread. */
        set_current(NULL);
        release(dev);
    }
}

int main(int argc, char **argv) {
    (void)argv;
    if (argc != 1) {
        fprintf(stderr, "usage: cuda_probe (no arguments)\n");
        return 2;
    }
    /* Line by line, so the lines before a crash in the driver still get out. */
    setvbuf(stdout, NULL, _IOLBF, 0);

    lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) {
        printf("cuda dlopen-failed %s\n", dlerror());
        printf("probe done\n");
        return 0;
    }
    char missing[256] = "";
    CUresult (*init)(unsigned int) = sym("cuInit", NULL, missing, sizeof missing);
    CUresult (*version)(int *) = sym("cuDriverGetVersion", NULL, missing, sizeof missing);
    CUresult (*get_count)(int *) = sym("cuDeviceGetCount", NULL, missing, sizeof missing);
    if (missing[0]) {
        printf("cuda missing-symbols%s\n", missing);
        printf("probe done\n");
        return 0;
    }
    p_cuGetErrorName = (CUresult(*)(CUresult, const char **))dlsym(lib, "cuGetErrorName");

    int v = 0, count = 0;
    CUresult rc = init(0);
    version(&v);
    CUresult count_rc = get_count(&count);
    if (count_rc != 0)
        count = 0;
    Dl_info info;
    memset(&info, 0, sizeof info);
    dladdr((void *)init, &info);
    printf("cuda init=%d version=%d count=%d lib=%s", rc, v, count,
           info.dli_fname ? info.dli_fname : "?");
    if (count_rc != 0)
        printf(" count_rc=%d", count_rc);
    printf("\n");

    if (rc == 0) {
        devices(count);
        kernel(count);
    } else {
        printf("kernel skipped init-failed %d %s\n", rc, errname(rc));
    }
    printf("probe done\n");
    return 0;
}
