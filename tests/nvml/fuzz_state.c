/*
 * Fuzz driver for the mock libnvidia-ml's state parser, built with -fsanitize=address,undefined.
 *
 * It includes the library's source (to reach its static parser) and reads length-prefixed cases
 * (4-byte little-endian length, then the bytes) from the file named on the command line. Every
 * case is parsed; a rejected case must come with a message; an accepted one is adopted as the
 * library's state, its events are drained through an event set and its MIG devices are walked the way
 * go-nvlib names their profiles, as a plugin would.
 */
#include "mock_nvml.c"

/* What NVIDIA's plugin asks of a GPU's MIG devices (go-nvlib VisitMigDevices and MigDevice.GetProfile). */
static void walk_migs(nvmlDevice_t gpu) {
    unsigned current, pending, count = 0, id, is_mig;
    nvmlDevice_t mig, parent;
    nvmlGpuInstance_t gi;
    nvmlComputeInstance_t ci;
    nvmlDeviceAttributes_t attrs;
    nvmlGpuInstanceInfo_t gi_info;
    nvmlComputeInstanceInfo_t ci_info;
    nvmlGpuInstanceProfileInfo_t gp;
    nvmlComputeInstanceProfileInfo_t cp;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    if (nvmlDeviceGetMigMode(gpu, &current, &pending) || nvmlDeviceGetMaxMigDeviceCount(gpu, &count)) return;
    for (unsigned p = 0; p <= NVML_GPU_INSTANCE_PROFILE_COUNT; p++) nvmlDeviceGetGpuInstanceProfileInfo(gpu, p, &gp);
    for (unsigned i = 0; i <= count; i++) {
        if (nvmlDeviceGetMigDeviceHandleByIndex(gpu, i, &mig)) continue;
        if (nvmlDeviceIsMigDeviceHandle(mig, &is_mig) || !is_mig) abort();
        if (nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig, &parent) || parent != gpu) abort();
        nvmlDeviceGetName(mig, name, sizeof name);
        nvmlDeviceGetAttributes_v2(mig, &attrs);
        if (nvmlDeviceGetGpuInstanceId(mig, &id) || nvmlDeviceGetGpuInstanceById(gpu, id, &gi)) abort();
        if (nvmlGpuInstanceGetInfo(gi, &gi_info) || nvmlDeviceGetComputeInstanceId(mig, &id)) abort();
        if (nvmlGpuInstanceGetComputeInstanceById(gi, id, &ci) || nvmlComputeInstanceGetInfo_v2(ci, &ci_info)) abort();
        for (unsigned p = 0; p <= NVML_COMPUTE_INSTANCE_PROFILE_COUNT; p++)
            nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, p, NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, &cp);
    }
}

int main(int argc, char **argv) {
    FILE *f;
    unsigned char hdr[4];
    size_t cases = 0, accepted = 0;
    nvmlEventSet_t set;
    if (argc != 2 || !(f = fopen(argv[1], "rb"))) {
        fprintf(stderr, "usage: %s CASES\n", argv[0]);
        return 2;
    }
    initialized = 1;
    if (nvmlEventSetCreate(&set)) return 3;
    while (fread(hdr, 1, 4, f) == 4) {
        size_t len = hdr[0] | hdr[1] << 8 | hdr[2] << 16 | (size_t)hdr[3] << 24;
        char *buf = malloc(len ? len : 1), err[ERR_LEN];
        struct state s;
        if (!buf || fread(buf, 1, len, f) != len) return 4;
        if (parse_state(buf, len, &s, err) == 0) {
            nvmlEventData_t data;
            accepted++;
            pthread_mutex_lock(&mu);
            apply_state(&s, accepted == 1);
            pthread_mutex_unlock(&mu);
            for (size_t i = 0; i < norder; i++) nvmlDeviceRegisterEvents(order[i], MOCK_EVENT_TYPES, set);
            for (size_t i = 0; i < norder; i++) walk_migs(order[i]);
            while (nvmlEventSetWait_v2(set, &data, 0) != NVML_ERROR_TIMEOUT) {
            }
            state_free(&s);
        } else if (!err[0]) {
            fprintf(stderr, "case %zu: rejected without a message\n", cases);
            return 1;
        }
        free(buf);
        cases++;
    }
    fclose(f);
    nvmlEventSetFree(set);
    for (size_t i = 0; i < ndevices; i++) free(devices[i]);
    free(devices);
    free(order);
    free(event_log);
    printf("cases %zu accepted %zu\n", cases, accepted);
    return 0;
}
