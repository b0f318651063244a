/*
 * nvml_check: loads an NVML library with dlopen, as nvml-wrapper does, and runs the calls named
 * on its command line against it, printing one line per call: "<call> <return code> [value]".
 *
 *   nvml_check LIB CALL...
 *
 * Calls: syms, init, init_v2, initflags, shutdown, count, count_null, index:<n>, byuuid:<uuid>,
 * uuid, uuid:<buffer length>, minor, idx, name, setmode:<n>, getmode, badhandle, driver,
 * errstr:<n>.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int ret_t;
typedef void *dev_t_;

static void *lib;

static void *sym(const char *name) {
    void *s = dlsym(lib, name);
    if (!s) {
        fprintf(stderr, "missing symbol %s\n", name);
        exit(3);
    }
    return s;
}

/* The symbols nvml-wrapper 0.13 calls for Nvml::builder().init(), device_count,
 * device_by_index, device_by_uuid, Device::uuid, minor_number, set_compute_mode, compute_mode
 * and drop (nvmlShutdown), and nvmlSystemGetDriverVersion, which its init calls. */
static const char *wanted[] = {
    "nvmlInit_v2", "nvmlInitWithFlags", "nvmlShutdown", "nvmlErrorString",
    "nvmlSystemGetDriverVersion", "nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetHandleByUUID", "nvmlDeviceGetUUID", "nvmlDeviceGetMinorNumber",
    "nvmlDeviceSetComputeMode", "nvmlDeviceGetComputeMode", "nvmlDeviceGetIndex",
    "nvmlDeviceGetName", NULL,
};

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: nvml_check LIB CALL...\n");
        return 2;
    }
    lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 2;
    }
    dev_t_ dev = NULL;
    for (int i = 2; i < argc; i++) {
        const char *c = argv[i];
        const char *arg = strchr(c, ':');
        arg = arg ? arg + 1 : "";
        char buf[256];
        if (strcmp(c, "syms") == 0) {
            int missing = 0;
            for (const char **w = wanted; *w; w++)
                if (!dlsym(lib, *w)) {
                    printf("syms missing %s\n", *w);
                    missing++;
                }
            printf("syms %d\n", missing);
        } else if (strcmp(c, "init") == 0) {
            printf("init %d\n", ((ret_t(*)(void))sym("nvmlInit"))());
        } else if (strcmp(c, "init_v2") == 0) {
            printf("init_v2 %d\n", ((ret_t(*)(void))sym("nvmlInit_v2"))());
        } else if (strcmp(c, "initflags") == 0) {
            printf("initflags %d\n", ((ret_t(*)(unsigned))sym("nvmlInitWithFlags"))(0));
        } else if (strcmp(c, "shutdown") == 0) {
            printf("shutdown %d\n", ((ret_t(*)(void))sym("nvmlShutdown"))());
        } else if (strcmp(c, "count") == 0) {
            unsigned n = 12345;
            ret_t r = ((ret_t(*)(unsigned *))sym("nvmlDeviceGetCount_v2"))(&n);
            printf("count %d %u\n", r, n);
        } else if (strcmp(c, "count_null") == 0) {
            printf("count_null %d\n", ((ret_t(*)(unsigned *))sym("nvmlDeviceGetCount_v2"))(NULL));
        } else if (strncmp(c, "index:", 6) == 0) {
            ret_t r = ((ret_t(*)(unsigned, dev_t_ *))sym("nvmlDeviceGetHandleByIndex_v2"))((unsigned)atoi(arg), &dev);
            printf("index %d\n", r);
        } else if (strncmp(c, "byuuid:", 7) == 0) {
            ret_t r = ((ret_t(*)(const char *, dev_t_ *))sym("nvmlDeviceGetHandleByUUID"))(arg, &dev);
            printf("byuuid %d\n", r);
        } else if (strcmp(c, "uuid") == 0 || strncmp(c, "uuid:", 5) == 0) {
            unsigned len = *arg ? (unsigned)atoi(arg) : 96;
            buf[0] = '\0';
            ret_t r = ((ret_t(*)(dev_t_, char *, unsigned))sym("nvmlDeviceGetUUID"))(dev, buf, len);
            printf("uuid %d %s\n", r, r == 0 ? buf : "-");
        } else if (strcmp(c, "name") == 0) {
            buf[0] = '\0';
            ret_t r = ((ret_t(*)(dev_t_, char *, unsigned))sym("nvmlDeviceGetName"))(dev, buf, 96);
            printf("name %d %s\n", r, r == 0 ? buf : "-");
        } else if (strcmp(c, "minor") == 0) {
            unsigned v = 12345;
            ret_t r = ((ret_t(*)(dev_t_, unsigned *))sym("nvmlDeviceGetMinorNumber"))(dev, &v);
            printf("minor %d %u\n", r, v);
        } else if (strcmp(c, "idx") == 0) {
            unsigned v = 12345;
            ret_t r = ((ret_t(*)(dev_t_, unsigned *))sym("nvmlDeviceGetIndex"))(dev, &v);
            printf("idx %d %u\n", r, v);
        } else if (strncmp(c, "setmode:", 8) == 0) {
            printf("setmode %d\n", ((ret_t(*)(dev_t_, int))sym("nvmlDeviceSetComputeMode"))(dev, atoi(arg)));
        } else if (strcmp(c, "getmode") == 0) {
            int m = -1;
            ret_t r = ((ret_t(*)(dev_t_, int *))sym("nvmlDeviceGetComputeMode"))(dev, &m);
            printf("getmode %d %d\n", r, m);
        } else if (strcmp(c, "badhandle") == 0) {
            dev = (dev_t_)&buf;
            printf("badhandle\n");
        } else if (strcmp(c, "driver") == 0) {
            ret_t r = ((ret_t(*)(char *, unsigned))sym("nvmlSystemGetDriverVersion"))(buf, 80);
            printf("driver %d %s\n", r, r == 0 ? buf : "-");
        } else if (strncmp(c, "errstr:", 7) == 0) {
            printf("errstr %s\n", ((const char *(*)(ret_t))sym("nvmlErrorString"))(atoi(arg)));
        } else {
            fprintf(stderr, "unknown call %s\n", c);
            return 2;
        }
    }
    return 0;
}
