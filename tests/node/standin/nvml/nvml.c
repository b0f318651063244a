/*
 * Stand-in libnvidia-ml.so.1 for nodes without a GPU.
 *
 * It answers the NVML calls gpu-share's `gpu-share reserve` agent makes through the Rust crate
 * nvml-wrapper 0.13 (init, device count, handle by index and by UUID, UUID, minor number,
 * compute mode, shutdown), plus the few that crate makes on its own at init
 * (nvmlSystemGetDriverVersion) and a handful of common ones, with NVML's own return codes.
 *
 * What it sees is what the stand-in CDI specs put in the container, as the real driver sees
 * the device nodes the runtime injected:
 *   - the driver is "loaded" when <dev>/nvidiactl exists (NVML_ERROR_DRIVER_NOT_LOADED
 *     otherwise);
 *   - a GPU is visible when the env GPU_SHARE_STANDIN_GPU_<minor>=<UUID> is set and
 *     <dev>/nvidia<minor> exists; GPUs are indexed in minor order;
 * where <dev> is /dev, or GPU_SHARE_STANDIN_DEV_DIR when set (for tests).
 * A driver in trouble: GPU_SHARE_STANDIN_NVML_FAIL=<nvmlReturn_t code> makes every init fail
 * with that code (15, NVML_ERROR_GPU_IS_LOST: a GPU fallen off the bus).
 *
 * nvmlDeviceSetComputeMode keeps the mode for later nvmlDeviceGetComputeMode calls and, when
 * GPU_SHARE_STANDIN_NVML_LOG names a directory, appends "<uuid> <MODE>" to
 * <dir>/compute-mode.log (MODE as nvidia-smi names it: DEFAULT, EXCLUSIVE_THREAD, PROHIBITED,
 * EXCLUSIVE_PROCESS); nvmlDeviceGetComputeMode reads the last line for the GPU back from that
 * file, so a later process sees the mode as it would on a real GPU.
 */
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef STANDIN_DRIVER_VERSION
#define STANDIN_DRIVER_VERSION "550.54.15"
#endif
#ifndef STANDIN_CUDA_DRIVER_VERSION
#define STANDIN_CUDA_DRIVER_VERSION 12040
#endif

#define EXPORT __attribute__((visibility("default")))

/* nvmlReturn_t values, as nvml.h numbers them. */
typedef enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_INSUFFICIENT_POWER = 8,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_IRQ_ISSUE = 11,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_CORRUPTED_INFOROM = 14,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_OPERATING_SYSTEM = 17,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_NO_DATA = 21,
    NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22,
    NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
    NVML_ERROR_FREQ_NOT_SUPPORTED = 24,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_DEPRECATED = 26,
    NVML_ERROR_NOT_READY = 27,
    NVML_ERROR_GPU_NOT_FOUND = 28,
    NVML_ERROR_INVALID_STATE = 29,
    NVML_ERROR_UNKNOWN = 999
} nvmlReturn_t;

/* nvmlComputeMode_t values, as nvml.h numbers them. */
typedef enum {
    NVML_COMPUTEMODE_DEFAULT = 0,
    NVML_COMPUTEMODE_EXCLUSIVE_THREAD = 1,
    NVML_COMPUTEMODE_PROHIBITED = 2,
    NVML_COMPUTEMODE_EXCLUSIVE_PROCESS = 3,
    NVML_COMPUTEMODE_COUNT = 4
} nvmlComputeMode_t;

/* Buffer sizes of nvml.h. */
#define NVML_DEVICE_UUID_V2_BUFFER_SIZE 96
#define NVML_DEVICE_NAME_V2_BUFFER_SIZE 96
#define NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE 80

#define MAX_GPUS 64

struct nvmlDevice_st {
    unsigned int index;
    unsigned int minor;
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    nvmlComputeMode_t mode;
};
typedef struct nvmlDevice_st *nvmlDevice_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int init_count;
static unsigned int gpu_count;
static struct nvmlDevice_st gpus[MAX_GPUS];

extern char **environ;

static const char *dev_dir(void) {
    const char *d = getenv("GPU_SHARE_STANDIN_DEV_DIR");
    return (d && *d) ? d : "/dev";
}

static int path_exists(const char *dir, const char *name) {
    char path[4096];
    struct stat st;
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
        return 0;
    return stat(path, &st) == 0;
}

static int by_minor(const void *a, const void *b) {
    const struct nvmlDevice_st *x = a, *y = b;
    return (x->minor > y->minor) - (x->minor < y->minor);
}

/* Finds the GPUs: markers GPU_SHARE_STANDIN_GPU_<minor>=<UUID> whose node exists. */
static nvmlReturn_t discover(void) {
    static const char prefix[] = "GPU_SHARE_STANDIN_GPU_";
    const char *dir = dev_dir();
    if (!path_exists(dir, "nvidiactl"))
        return NVML_ERROR_DRIVER_NOT_LOADED;
    gpu_count = 0;
    for (char **e = environ; e && *e; e++) {
        const char *s = *e;
        if (strncmp(s, prefix, sizeof prefix - 1) != 0)
            continue;
        s += sizeof prefix - 1;
        char *end;
        errno = 0;
        unsigned long minor = strtoul(s, &end, 10);
        if (end == s || *end != '=' || errno != 0 || minor > 255 || !isdigit((unsigned char)*s))
            continue;
        const char *uuid = end + 1;
        if (*uuid == '\0' || strlen(uuid) >= NVML_DEVICE_UUID_V2_BUFFER_SIZE)
            continue;
        char node[32];
        snprintf(node, sizeof node, "nvidia%lu", minor);
        if (!path_exists(dir, node))
            continue;
        int dup = 0;
        for (unsigned int i = 0; i < gpu_count; i++)
            if (gpus[i].minor == minor)
                dup = 1;
        if (dup || gpu_count == MAX_GPUS)
            continue;
        struct nvmlDevice_st *g = &gpus[gpu_count++];
        memset(g, 0, sizeof *g);
        g->minor = (unsigned int)minor;
        strcpy(g->uuid, uuid);
        g->mode = NVML_COMPUTEMODE_DEFAULT;
    }
    qsort(gpus, gpu_count, sizeof gpus[0], by_minor);
    for (unsigned int i = 0; i < gpu_count; i++)
        gpus[i].index = i;
    return NVML_SUCCESS;
}

static int valid(nvmlDevice_t d) {
    return d >= gpus && d < gpus + gpu_count && init_count > 0;
}

static const char *mode_word(unsigned int mode) {
    switch (mode) {
    case NVML_COMPUTEMODE_DEFAULT: return "DEFAULT";
    case NVML_COMPUTEMODE_EXCLUSIVE_THREAD: return "EXCLUSIVE_THREAD";
    case NVML_COMPUTEMODE_PROHIBITED: return "PROHIBITED";
    case NVML_COMPUTEMODE_EXCLUSIVE_PROCESS: return "EXCLUSIVE_PROCESS";
    }
    return NULL;
}

static int log_path(char *buf, size_t n) {
    const char *dir = getenv("GPU_SHARE_STANDIN_NVML_LOG");
    if (!dir || !*dir)
        return 0;
    return snprintf(buf, n, "%s/compute-mode.log", dir) < (int)n;
}

/* The mode last recorded for the GPU in the log, or -1. */
static int logged_mode(const char *uuid) {
    char path[4096], line[256];
    if (!log_path(path, sizeof path))
        return -1;
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    int mode = -1;
    size_t ulen = strlen(uuid);
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, uuid, ulen) != 0 || line[ulen] != ' ')
            continue;
        char *w = line + ulen + 1;
        w[strcspn(w, "\r\n")] = '\0';
        for (unsigned int m = 0; m < NVML_COMPUTEMODE_COUNT; m++)
            if (strcmp(w, mode_word(m)) == 0)
                mode = (int)m;
    }
    fclose(f);
    return mode;
}

/* The init failure GPU_SHARE_STANDIN_NVML_FAIL asks for, or NVML_SUCCESS. */
static nvmlReturn_t injected(void) {
    const char *s = getenv("GPU_SHARE_STANDIN_NVML_FAIL");
    if (!s || !*s)
        return NVML_SUCCESS;
    char *end;
    errno = 0;
    long code = strtol(s, &end, 10);
    if (*end != '\0' || errno != 0 || code <= 0 || code > NVML_ERROR_UNKNOWN)
        return NVML_ERROR_UNKNOWN;
    return (nvmlReturn_t)code;
}

static nvmlReturn_t init_locked(void) {
    nvmlReturn_t fail = injected();
    if (fail != NVML_SUCCESS)
        return fail;
    if (init_count > 0) {
        init_count++;
        return NVML_SUCCESS;
    }
    nvmlReturn_t r = discover();
    if (r == NVML_SUCCESS)
        init_count = 1;
    return r;
}

EXPORT nvmlReturn_t nvmlInit_v2(void) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t r = init_locked();
    pthread_mutex_unlock(&lock);
    return r;
}

EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return nvmlInit_v2();
}

EXPORT nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t r = NVML_SUCCESS;
    if (init_count == 0)
        r = NVML_ERROR_UNINITIALIZED;
    else if (--init_count == 0)
        gpu_count = 0;
    pthread_mutex_unlock(&lock);
    return r;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_NOT_READY: return "System is not ready for the request";
    case NVML_ERROR_GPU_NOT_FOUND: return "GPU not found";
    case NVML_ERROR_INVALID_STATE: return "Invalid state";
    default: return "Unknown Error";
    }
}

static nvmlReturn_t copy_string(char *dst, unsigned int len, const char *src) {
    if (!dst)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > len)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(dst, src);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    /* Answered without init, as the real library does. */
    return copy_string(version, length, STANDIN_DRIVER_VERSION);
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    char v[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
    snprintf(v, sizeof v, "%d.%s", STANDIN_CUDA_DRIVER_VERSION / 1000, STANDIN_DRIVER_VERSION);
    return copy_string(version, length, v);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    if (!version)
        return NVML_ERROR_INVALID_ARGUMENT;
    *version = STANDIN_CUDA_DRIVER_VERSION;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) {
    return nvmlSystemGetCudaDriverVersion(version);
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t r = NVML_SUCCESS;
    if (init_count == 0)
        r = NVML_ERROR_UNINITIALIZED;
    else if (!count)
        r = NVML_ERROR_INVALID_ARGUMENT;
    else
        *count = gpu_count;
    pthread_mutex_unlock(&lock);
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t r = NVML_SUCCESS;
    if (init_count == 0)
        r = NVML_ERROR_UNINITIALIZED;
    else if (!device || index >= gpu_count)
        r = NVML_ERROR_INVALID_ARGUMENT;
    else
        *device = &gpus[index];
    pthread_mutex_unlock(&lock);
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t r = NVML_ERROR_NOT_FOUND;
    if (init_count == 0)
        r = NVML_ERROR_UNINITIALIZED;
    else if (!uuid || !device)
        r = NVML_ERROR_INVALID_ARGUMENT;
    else
        for (unsigned int i = 0; i < gpu_count; i++)
            if (strcmp(gpus[i].uuid, uuid) == 0) {
                *device = &gpus[i];
                r = NVML_SUCCESS;
                break;
            }
    pthread_mutex_unlock(&lock);
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t r;
    if (init_count == 0)
        r = NVML_ERROR_UNINITIALIZED;
    else if (!valid(device))
        r = NVML_ERROR_INVALID_ARGUMENT;
    else
        r = copy_string(uuid, length, device->uuid);
    pthread_mutex_unlock(&lock);
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t r;
    if (init_count == 0)
        r = NVML_ERROR_UNINITIALIZED;
    else if (!valid(device))
        r = NVML_ERROR_INVALID_ARGUMENT;
    else
        r = copy_string(name, length, "NVIDIA Stand-in GPU");
    pthread_mutex_unlock(&lock);
    return r;
}

static nvmlReturn_t get_uint(nvmlDevice_t device, unsigned int *out, int minor) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t r = NVML_SUCCESS;
    if (init_count == 0)
        r = NVML_ERROR_UNINITIALIZED;
    else if (!valid(device) || !out)
        r = NVML_ERROR_INVALID_ARGUMENT;
    else
        *out = minor ? device->minor : device->index;
    pthread_mutex_unlock(&lock);
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor) {
    return get_uint(device, minor, 1);
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    return get_uint(device, index, 0);
}

EXPORT nvmlReturn_t nvmlDeviceSetComputeMode(nvmlDevice_t device, nvmlComputeMode_t mode) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t r = NVML_SUCCESS;
    char path[4096];
    if (init_count == 0)
        r = NVML_ERROR_UNINITIALIZED;
    else if (!valid(device) || (unsigned int)mode >= NVML_COMPUTEMODE_COUNT)
        r = NVML_ERROR_INVALID_ARGUMENT;
    else if (log_path(path, sizeof path)) {
        FILE *f = fopen(path, "a");
        if (!f)
            r = errno == EACCES ? NVML_ERROR_NO_PERMISSION : NVML_ERROR_UNKNOWN;
        else {
            if (fprintf(f, "%s %s\n", device->uuid, mode_word(mode)) < 0)
                r = NVML_ERROR_UNKNOWN;
            if (fclose(f) != 0)
                r = NVML_ERROR_UNKNOWN;
        }
    }
    if (r == NVML_SUCCESS)
        device->mode = mode;
    pthread_mutex_unlock(&lock);
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, nvmlComputeMode_t *mode) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t r = NVML_SUCCESS;
    if (init_count == 0)
        r = NVML_ERROR_UNINITIALIZED;
    else if (!valid(device) || !mode)
        r = NVML_ERROR_INVALID_ARGUMENT;
    else {
        int logged = logged_mode(device->uuid);
        *mode = logged >= 0 ? (nvmlComputeMode_t)logged : device->mode;
    }
    pthread_mutex_unlock(&lock);
    return r;
}
