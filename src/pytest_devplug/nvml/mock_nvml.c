/*
 * A mock libnvidia-ml.so.1 for GPU-less machines, driven by pytest-devplug's mock-state file.
 *
 * Any process that loads "libnvidia-ml.so.1" (go-nvml's dlopen, pynvml's CDLL, a C program) gets
 * these functions, with NVML's names, struct layouts and return codes (NVIDIA's go-nvml module's
 * nvml.h is the reference). What the GPUs look like comes from the JSON file named by
 * DEVPLUG_NVML_STATE (docs/explanation/design.md):
 *
 *   {"gpus": [{"uuid": "GPU-...", "model": "a100-40gb", "name": "...", "memory_mib": 40960, "numa_node": 0, "minor": 0,
 *              "lost": false, "fail_allocate": false,
 *              "mig_enabled": true, "mig_devices": [{"uuid": "MIG-...", "profile": "1g.5gb", "gi": 1}]}],
 *    "events": [{"uuid": "GPU-...", "xid": 79}, {"uuid": "GPU-...", "ecc": "uncorrected"}]}
 *
 * "model" (a100-40gb, the default; a100-80gb, h100-80gb, h200-141gb, b200) gives what the state does not carry:
 * the PCI device ID, architecture, CUDA compute capability and SM counts, and an NVLink fabric on the Hopper and
 * newer ones (nvmlDeviceGetGpuFabricInfo); the MIG geometry (7 compute, 8 memory slices) is the same on all of them,
 * the profiles named for the GPU's memory.
 *
 * MIG: a GPU with "mig_enabled" (true or false) is MIG-capable, one without it is not (NVML answers
 * NOT_SUPPORTED). A MIG-enabled GPU holds the MIG devices of "mig_devices", each a GPU instance with one
 * compute instance of the same size (the profiles "<n>g.<m>gb" of an A100, named for the GPU's memory as
 * NVIDIA's go-nvlib names them: 1g.5gb, 1g.5gb+me, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb on 40 GiB),
 * "gi" its GPU instance ID (default: its position + 1). MIG device handles answer the MIG calls NVIDIA's
 * k8s-device-plugin makes (nvmlDeviceGetMigDeviceHandleByIndex, ...GetDeviceHandleFromMigDeviceHandle,
 * ...GetAttributes_v2, GPU and compute instances and their profiles); a lost GPU's MIG devices answer
 * GPU_IS_LOST, and Xids are GPU-wide (no GPU/compute instance in the event), as for a GPU that fell off
 * the bus.
 *
 * The file is read at every nvmlInit that finds the library uninitialised, and re-read whenever it
 * changes while initialised (inotify on its directory, followed by a thread that sleeps in poll()).
 * The events a file holds when this process first reads it are history. Each entry appended later
 * is delivered once to every event set that registered its GPU for Xid events, as an
 * nvmlEventTypeXidCriticalError, and a waiter in nvmlEventSetWait wakes at once. A set sees the
 * events appended since the nvmlInit it was created under, also those from before it registered
 * the GPU: a plugin that arms its health checks after registering with the kubelet (NVIDIA's)
 * must not miss a fault injected in between. A GPU with
 * "lost": true answers NVML_ERROR_GPU_IS_LOST on its handle, and the next wait of each set that
 * registered it returns NVML_ERROR_GPU_IS_LOST once (NVML's documented answer when a GPU fell off
 * the bus). A malformed file never harms the host process: the last good state stays, and the
 * problem is printed once to stderr.
 *
 * ECC: an "events" entry holds either "xid" or "ecc": "uncorrected", an uncorrectable (double-bit) ECC error in
 * the GPU's memory. Every GPU reports ECC enabled (nvmlDeviceGetEccMode); its uncorrected counts
 * (nvmlDeviceGetTotalEccErrors, nvmlDeviceGetMemoryErrorCounter at DEVICE_MEMORY) are the ECC entries naming
 * it in the file, volatile and aggregate alike (the mock's driver never reloads), its corrected counts 0. An
 * ECC entry appended later is delivered as the driver delivers a DBE: an nvmlEventTypeDoubleBitEccError
 * (eventData 0) to the sets that registered the GPU for it, then Xid 48 (an nvmlEventTypeXidCriticalError) to
 * those that registered it for Xids. Supported event types: SingleBitEcc, DoubleBitEcc, XidCriticalError.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))

/* ---- NVML's types and codes (go-nvml v0.12.9-0, pkg/nvml/nvml.h) ---------------------------- */
typedef enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999
} nvmlReturn_t;

#define NVML_DEVICE_UUID_V2_BUFFER_SIZE 96
#define NVML_DEVICE_NAME_V2_BUFFER_SIZE 96
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE 32
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE 16
#define nvmlEventTypeSingleBitEccError 0x0000000000000001LL
#define nvmlEventTypeDoubleBitEccError 0x0000000000000002LL
#define nvmlEventTypeXidCriticalError 0x0000000000000008LL
#define MOCK_EVENT_TYPES (nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError | nvmlEventTypeXidCriticalError)
#define XID_DBE 48 /* the Xid the driver logs for a double-bit ECC error */
#define NVML_FEATURE_ENABLED 1
#define NVML_MEMORY_ERROR_TYPE_CORRECTED 0
#define NVML_MEMORY_ERROR_TYPE_UNCORRECTED 1
#define NVML_VOLATILE_ECC 0
#define NVML_AGGREGATE_ECC 1
#define NVML_MEMORY_LOCATION_DEVICE_MEMORY 2
#define NVML_MEMORY_LOCATION_COUNT 8
#define NVML_TOPOLOGY_INTERNAL 0
#define NVML_TOPOLOGY_NODE 40
#define NVML_TOPOLOGY_SYSTEM 50
#define NVML_STRUCT_VERSION(data, ver) (unsigned int)(sizeof(nvml##data##_v##ver##_t) | ((ver) << 24U))

typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct nvmlEventSet_st *nvmlEventSet_t;
typedef struct nvmlGpuInstance_st *nvmlGpuInstance_t;
typedef struct nvmlComputeInstance_st *nvmlComputeInstance_t;

#define NVML_DEVICE_MIG_DISABLE 0
#define NVML_DEVICE_MIG_ENABLE 1
#define NVML_GPU_INSTANCE_PROFILE_COUNT 17
#define NVML_COMPUTE_INSTANCE_PROFILE_COUNT 8
#define NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED 0

typedef struct {
    unsigned int multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount, sharedEncoderCount, sharedJpegCount,
        sharedOfaCount, gpuInstanceSliceCount, computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;

typedef struct {
    unsigned int id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount, copyEngineCount, decoderCount,
        encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
} nvmlGpuInstanceProfileInfo_t;

typedef struct {
    unsigned int start, size;
} nvmlGpuInstancePlacement_t, nvmlComputeInstancePlacement_t;

typedef struct {
    nvmlDevice_t device;
    unsigned int id, profileId;
    nvmlGpuInstancePlacement_t placement;
} nvmlGpuInstanceInfo_t;

typedef struct {
    unsigned int id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount,
        sharedEncoderCount, sharedJpegCount, sharedOfaCount;
} nvmlComputeInstanceProfileInfo_t;

typedef struct {
    nvmlDevice_t device;
    nvmlGpuInstance_t gpuInstance;
    unsigned int id, profileId;
    nvmlComputeInstancePlacement_t placement;
} nvmlComputeInstanceInfo_t;

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
#define nvmlMemory_v2 NVML_STRUCT_VERSION(Memory, 2)

typedef struct {
    char busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
} nvmlPciInfo_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

/* What the mock reports for every GPU, besides what the state file and its GPU model say. */
#define MOCK_DRIVER_VERSION "550.54.15"
#define MOCK_NVML_VERSION "12.550.54.15"
#define MOCK_CUDA_DRIVER_VERSION 12040
#define NVML_DEVICE_ARCH_AMPERE 7
#define NVML_DEVICE_ARCH_HOPPER 9
#define NVML_DEVICE_ARCH_BLACKWELL 10
#define NVML_BRAND_NVIDIA 14 /* what NVML says of data-center GPUs since the A100 ("Product Brand: NVIDIA") */

/* A GPU model (a state GPU's "model"; its "name" and "memory_mib" come with the state): what NVML answers for it
 * that the state does not carry. Facts from NVIDIA's data sheets and PCI IDs. */
struct gpu_model {
    const char *key;
    unsigned pci_device_id; /* device << 16 | vendor 0x10DE */
    unsigned arch, cc_major, cc_minor;
    unsigned sms, sms_per_slice; /* SMs of the whole GPU, and of one MIG compute slice */
};

static const struct gpu_model gpu_models[] = {
    {"a100-40gb", 0x20B010DEU, NVML_DEVICE_ARCH_AMPERE, 8, 0, 108, 14},
    {"a100-80gb", 0x20B210DEU, NVML_DEVICE_ARCH_AMPERE, 8, 0, 108, 14},
    {"h100-80gb", 0x233010DEU, NVML_DEVICE_ARCH_HOPPER, 9, 0, 132, 16},
    {"h200-141gb", 0x233510DEU, NVML_DEVICE_ARCH_HOPPER, 9, 0, 132, 16},
    {"b200", 0x290110DEU, NVML_DEVICE_ARCH_BLACKWELL, 10, 0, 148, 18},
};
#define NMODELS (sizeof gpu_models / sizeof gpu_models[0])

/* ---- MIG: an A100's GPU instance profiles, each with a compute instance as large as itself ---------- */
#define MIG_MAX 7          /* MIG devices on one GPU (nvmlDeviceGetMaxMigDeviceCount) */
#define MIG_SLICES 7       /* compute slices of one GPU */
#define MIG_MEMORY_SLICES 8 /* memory slices of one GPU */
#define MIG_GI_ID_MAX 14   /* GPU instance IDs 0..14 */

struct mig_profile {
    unsigned gi_profile;  /* NVML_GPU_INSTANCE_PROFILE_*: 0 1_SLICE, 1 2_SLICE, 2 3_SLICE, 3 4_SLICE, 4 7_SLICE,
                             7 1_SLICE_REV1 (+me), 9 1_SLICE_REV2 */
    unsigned slices;      /* compute slices of the GPU instance, and of its compute instance */
    unsigned mem_slices;  /* eighths of the GPU's memory */
    unsigned instances;   /* how many of it fit on one GPU */
    const char *suffix;   /* what go-nvlib appends to the name */
};

static const struct mig_profile mig_profiles[] = {
    {0, 1, 1, 7, ""}, {7, 1, 1, 1, "+me"}, {9, 1, 2, 4, ""}, {1, 2, 2, 3, ""},
    {2, 3, 4, 2, ""}, {3, 4, 4, 1, ""},    {4, 7, 8, 1, ""},
};
#define NPROFILES (sizeof mig_profiles / sizeof mig_profiles[0])

/* NVML_COMPUTE_INSTANCE_PROFILE_<n>_SLICE for a compute instance of `slices` (1, 2, 3, 4, 7), else -1. */
static int ci_profile_id(unsigned slices) {
    switch (slices) {
    case 1: return 0;
    case 2: return 1;
    case 3: return 2;
    case 4: return 3;
    case 7: return 4;
    default: return -1;
    }
}

static const struct mig_profile *gi_profile(unsigned id) {
    for (size_t i = 0; i < NPROFILES; i++)
        if (mig_profiles[i].gi_profile == id) return &mig_profiles[i];
    return NULL;
}

/* A profile's memory on a GPU of memory_mib MiB. */
static unsigned long long profile_memory_mib(const struct mig_profile *p, unsigned long long memory_mib) {
    return memory_mib / MIG_MEMORY_SLICES * p->mem_slices;
}

/* Its name as go-nvlib derives it (getMigMemorySizeGB: memory fraction rounded up to eighths, times the GPU's
 * memory in whole GiB rounded up, rounded): "1g.5gb" on a 40 GiB GPU. */
static void profile_name(const struct mig_profile *p, unsigned long long memory_mib, char *out, size_t size) {
    unsigned long long gib = (memory_mib + 1023) / 1024, gb = (p->mem_slices * gib * 2 + MIG_MEMORY_SLICES) / 16;
    snprintf(out, size, "%ug.%llugb%s", p->slices, gb, p->suffix);
}

/* ---- limits of the state file --------------------------------------------------------------- */
#define STATE_MAX_BYTES (64L << 20)
#define JSON_MAX_DEPTH 32
#define NUMA_NODE_MAX 1023 /* Linux: at most 1024 NUMA nodes (NODES_SHIFT <= 10) */
#define MEMORY_MIB_MAX (ULLONG_MAX >> 20)
#define ERR_LEN 320

/* ---- JSON: a small strict parser (RFC 8259, UTF-8 only) ------------------------------------- */
enum jtype { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };

struct json {
    enum jtype type;
    int boolean;
    /* J_NUM: an integer when is_int; magnitude saturates (overflow set) beyond 2^64-1 */
    int negative, is_int, overflow;
    unsigned long long magnitude;
    char *str; /* J_STR: decoded bytes (may hold NUL), len bytes */
    size_t len;
    struct json *items; /* J_ARR / J_OBJ: n values; J_OBJ: keys[i] (klen[i] bytes) */
    char **keys;
    size_t *klen;
    size_t n;
};

struct parser {
    const unsigned char *p, *start, *end;
    int depth;
    char err[ERR_LEN];
};

static void json_free(struct json *v) {
    for (size_t i = 0; i < v->n; i++) {
        json_free(&v->items[i]);
        if (v->keys) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->klen);
    free(v->str);
    memset(v, 0, sizeof *v);
}

static int fail(struct parser *ps, const char *what) {
    if (!ps->err[0])
        snprintf(ps->err, sizeof ps->err, "invalid JSON at byte %ld: %s", (long)(ps->p - ps->start), what);
    return -1;
}

static void skip_ws(struct parser *ps) {
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')) ps->p++;
}

/* Length of the valid UTF-8 sequence at p, or 0 (overlong forms, surrogates, > U+10FFFF refused). */
static size_t utf8_seq(const unsigned char *p, const unsigned char *end) {
    unsigned c = p[0];
    size_t n;
    unsigned min, cp;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) n = 2, min = 0x80, cp = c & 0x1F;
    else if (c >= 0xE0 && c <= 0xEF) n = 3, min = 0x800, cp = c & 0x0F;
    else if (c >= 0xF0 && c <= 0xF4) n = 4, min = 0x10000, cp = c & 0x07;
    else return 0;
    if ((size_t)(end - p) < n) return 0;
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (p[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return n;
}

static int put_utf8(char *out, size_t *len, unsigned cp) {
    if (cp < 0x80) out[(*len)++] = (char)cp;
    else if (cp < 0x800) {
        out[(*len)++] = (char)(0xC0 | (cp >> 6));
        out[(*len)++] = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out[(*len)++] = (char)(0xE0 | (cp >> 12));
        out[(*len)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[(*len)++] = (char)(0x80 | (cp & 0x3F));
    } else {
        out[(*len)++] = (char)(0xF0 | (cp >> 18));
        out[(*len)++] = (char)(0x80 | ((cp >> 12) & 0x3F));
        out[(*len)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[(*len)++] = (char)(0x80 | (cp & 0x3F));
    }
    return 0;
}

static int hex4(struct parser *ps, unsigned *out) {
    *out = 0;
    if (ps->end - ps->p < 4) return fail(ps, "truncated \\u escape");
    for (int i = 0; i < 4; i++) {
        unsigned c = *ps->p++, d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return fail(ps, "bad \\u escape");
        *out = (*out << 4) | d;
    }
    return 0;
}

/* A string after its opening quote; decoded output is never longer than the input. */
static int parse_string(struct parser *ps, char **out, size_t *outlen) {
    const unsigned char *q = ps->p;
    while (q < ps->end && *q != '"') q += (*q == '\\' && q + 1 < ps->end) ? 2 : 1;
    if (q >= ps->end) return fail(ps, "unterminated string");
    char *buf = malloc((size_t)(q - ps->p) + 1);
    size_t len = 0;
    if (!buf) return fail(ps, "out of memory");
    while (*ps->p != '"') {
        unsigned c = *ps->p;
        if (c < 0x20) goto bad_control;
        if (c != '\\') {
            size_t n = utf8_seq(ps->p, ps->end);
            if (!n) goto bad_utf8;
            memcpy(buf + len, ps->p, n);
            len += n, ps->p += n;
            continue;
        }
        ps->p++;
        switch (*ps->p++) {
        case '"': buf[len++] = '"'; break;
        case '\\': buf[len++] = '\\'; break;
        case '/': buf[len++] = '/'; break;
        case 'b': buf[len++] = '\b'; break;
        case 'f': buf[len++] = '\f'; break;
        case 'n': buf[len++] = '\n'; break;
        case 'r': buf[len++] = '\r'; break;
        case 't': buf[len++] = '\t'; break;
        case 'u': {
            unsigned cp, lo;
            if (hex4(ps, &cp)) goto out_err;
            if (cp >= 0xDC00 && cp <= 0xDFFF) goto bad_surrogate;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (ps->end - ps->p < 2 || ps->p[0] != '\\' || ps->p[1] != 'u') goto bad_surrogate;
                ps->p += 2;
                if (hex4(ps, &lo)) goto out_err;
                if (lo < 0xDC00 || lo > 0xDFFF) goto bad_surrogate;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            put_utf8(buf, &len, cp);
            break;
        }
        default: ps->p--; fail(ps, "unknown escape"); goto out_err;
        }
    }
    ps->p++;
    buf[len] = '\0';
    *out = buf, *outlen = len;
    return 0;
bad_control: fail(ps, "control character in string"); goto out_err;
bad_utf8: fail(ps, "not UTF-8"); goto out_err;
bad_surrogate: fail(ps, "unpaired surrogate in \\u escape");
out_err:
    free(buf);
    return -1;
}

static int parse_number(struct parser *ps, struct json *v) {
    v->type = J_NUM, v->is_int = 1;
    if (*ps->p == '-') v->negative = 1, ps->p++;
    if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') return fail(ps, "bad number");
    if (*ps->p == '0' && ps->p + 1 < ps->end && ps->p[1] >= '0' && ps->p[1] <= '9') return fail(ps, "leading zero");
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
        unsigned d = *ps->p++ - '0';
        if (v->magnitude > (ULLONG_MAX - d) / 10) v->overflow = 1, v->magnitude = ULLONG_MAX;
        else v->magnitude = v->magnitude * 10 + d;
    }
    if (ps->p < ps->end && *ps->p == '.') {
        v->is_int = 0, ps->p++;
        if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') return fail(ps, "bad fraction");
        while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') ps->p++;
    }
    if (ps->p < ps->end && (*ps->p == 'e' || *ps->p == 'E')) {
        v->is_int = 0, ps->p++;
        if (ps->p < ps->end && (*ps->p == '+' || *ps->p == '-')) ps->p++;
        if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') return fail(ps, "bad exponent");
        while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') ps->p++;
    }
    return 0;
}

static int literal(struct parser *ps, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n)) return fail(ps, "unexpected character");
    ps->p += n;
    return 0;
}

static int parse_value(struct parser *ps, struct json *v);

/* Array or object after its opening bracket; appends into v->items (and v->keys for objects). */
static int parse_container(struct parser *ps, struct json *v, int object) {
    size_t cap = 0;
    unsigned char close = object ? '}' : ']';
    if (++ps->depth > JSON_MAX_DEPTH) return fail(ps, "nested deeper than 32 levels");
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++, ps->depth--;
        return 0;
    }
    for (;;) {
        if (v->n == cap) {
            size_t ncap = cap ? cap * 2 : 8;
            struct json *items = realloc(v->items, ncap * sizeof *items);
            if (!items) return fail(ps, "out of memory");
            v->items = items;
            if (object) {
                char **keys = realloc(v->keys, ncap * sizeof *keys);
                if (keys) v->keys = keys;
                size_t *klen = keys ? realloc(v->klen, ncap * sizeof *klen) : NULL;
                if (!klen) return fail(ps, "out of memory");
                v->klen = klen;
            }
            cap = ncap;
        }
        memset(&v->items[v->n], 0, sizeof v->items[0]);
        if (object) {
            v->keys[v->n] = NULL;
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != '"') return fail(ps, "expected a string key");
            ps->p++;
            if (parse_string(ps, &v->keys[v->n], &v->klen[v->n])) return -1;
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ':') {
                free(v->keys[v->n]);
                return fail(ps, "expected ':'");
            }
            ps->p++;
        }
        v->n++; /* counted before parsing so that json_free releases a partial value */
        if (parse_value(ps, &v->items[v->n - 1])) return -1;
        skip_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        if (ps->p < ps->end && *ps->p == close) {
            ps->p++, ps->depth--;
            return 0;
        }
        return fail(ps, object ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static int parse_value(struct parser *ps, struct json *v) {
    skip_ws(ps);
    if (ps->p >= ps->end) return fail(ps, "unexpected end");
    switch (*ps->p) {
    case '{': ps->p++, v->type = J_OBJ; return parse_container(ps, v, 1);
    case '[': ps->p++, v->type = J_ARR; return parse_container(ps, v, 0);
    case '"': ps->p++, v->type = J_STR; return parse_string(ps, &v->str, &v->len);
    case 't': v->type = J_BOOL, v->boolean = 1; return literal(ps, "true");
    case 'f': v->type = J_BOOL; return literal(ps, "false");
    case 'n': v->type = J_NULL; return literal(ps, "null");
    default: return parse_number(ps, v);
    }
}

/* ---- the state document --------------------------------------------------------------------- */
struct mig {
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    const struct mig_profile *profile;
    unsigned gi; /* its GPU instance ID; its compute instance is 0 */
};

struct gpu {
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    const struct gpu_model *model;
    unsigned long long memory_mib;
    unsigned long long ecc_uncorrected; /* the ECC entries of "events" naming it */
    int has_numa, lost;
    unsigned numa_node, minor;
    int mig_capable, mig_enabled;
    struct mig migs[MIG_MAX];
    size_t nmigs;
};

struct xid_event {
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    unsigned long long xid; /* an ECC entry: XID_DBE, its companion */
    int ecc;                /* an uncorrectable ECC error ("ecc": "uncorrected") */
};

struct state {
    struct gpu *gpus;
    size_t ngpus;
    struct xid_event *events;
    size_t nevents;
};

static void state_free(struct state *s) {
    free(s->gpus);
    free(s->events);
    memset(s, 0, sizeof *s);
}

static int field_error(char *err, const char *where, const char *key, const char *fmt, ...) {
    char what[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(err, ERR_LEN, "%s.%s: %s", where, key, what);
    return -1;
}

/* The value of `key` in object o, NULL when absent; *dup is set when the key appears twice. */
static const struct json *get(const struct json *o, const char *key, int *dup) {
    const struct json *found = NULL;
    size_t n = strlen(key);
    for (size_t i = 0; i < o->n; i++) {
        if (o->klen[i] == n && !memcmp(o->keys[i], key, n)) {
            if (found) *dup = 1;
            found = &o->items[i];
        }
    }
    return found;
}

/* Integer field in [0, max]; absent -> *out = dflt (or an error when dflt < 0 means required). */
static int get_uint(const struct json *o, const char *where, const char *key, unsigned long long max,
                    long long dflt, unsigned long long *out, char *err) {
    int dup = 0;
    const struct json *v = get(o, key, &dup);
    if (dup) return field_error(err, where, key, "given twice");
    if (!v) {
        if (dflt < 0) return field_error(err, where, key, "missing");
        *out = (unsigned long long)dflt;
        return 0;
    }
    if (v->type != J_NUM || !v->is_int) return field_error(err, where, key, "must be an integer");
    if (v->negative && v->magnitude) return field_error(err, where, key, "must not be negative");
    if (v->overflow || v->magnitude > max)
        return field_error(err, where, key, "out of range (0..%llu)", max);
    *out = v->magnitude;
    return 0;
}

static int get_bool(const struct json *o, const char *where, const char *key, int *out, char *err) {
    int dup = 0;
    const struct json *v = get(o, key, &dup);
    if (dup) return field_error(err, where, key, "given twice");
    *out = 0;
    if (!v) return 0;
    if (v->type != J_BOOL) return field_error(err, where, key, "must be true or false");
    *out = v->boolean;
    return 0;
}

/* String field copied into out[size]; a UUID is printable ASCII without spaces. */
static int get_text(const struct json *o, const char *where, const char *key, const char *dflt, int is_uuid,
                    char *out, size_t size, char *err) {
    int dup = 0;
    const struct json *v = get(o, key, &dup);
    if (dup) return field_error(err, where, key, "given twice");
    if (!v) {
        if (!dflt) return field_error(err, where, key, "missing");
        snprintf(out, size, "%s", dflt);
        return 0;
    }
    if (v->type != J_STR) return field_error(err, where, key, "must be a string");
    if (v->len == 0) return field_error(err, where, key, "must not be empty");
    if (v->len >= size) return field_error(err, where, key, "longer than NVML's %zu-byte limit", size - 1);
    for (size_t i = 0; i < v->len; i++) {
        unsigned char c = (unsigned char)v->str[i];
        if (is_uuid ? (c <= 0x20 || c >= 0x7F) : (c < 0x20 || c == 0x7F))
            return field_error(err, where, key, is_uuid ? "must be printable ASCII without spaces (byte %zu)"
                                                        : "holds a control character (byte %zu)", i);
    }
    memcpy(out, v->str, v->len + 1);
    return 0;
}

static int cmp_minor(const void *a, const void *b) {
    unsigned x = *(const unsigned *)a, y = *(const unsigned *)b;
    return (x > y) - (x < y);
}

static int cmp_text(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Refuse two GPUs with the same minor, two devices (GPUs and MIG devices) with the same uuid (sorted copies:
 * 10,000 GPUs stay cheap). */
static int check_unique(const struct state *s, char *err) {
    unsigned *minors;
    const char **uuids;
    size_t n = 0;
    int rc = 0;
    if (s->ngpus < 1) return 0;
    minors = malloc(s->ngpus * sizeof *minors);
    uuids = malloc(s->ngpus * (MIG_MAX + 1) * sizeof *uuids);
    if (!minors || !uuids) return free(minors), free(uuids), snprintf(err, ERR_LEN, "out of memory"), -1;
    for (size_t i = 0; i < s->ngpus; i++) {
        minors[i] = s->gpus[i].minor;
        uuids[n++] = s->gpus[i].uuid;
        for (size_t j = 0; j < s->gpus[i].nmigs; j++) uuids[n++] = s->gpus[i].migs[j].uuid;
    }
    qsort(uuids, n, sizeof *uuids, cmp_text);
    for (size_t i = 1; i < n && !rc; i++)
        if (!strcmp(uuids[i - 1], uuids[i])) snprintf(err, ERR_LEN, "gpus: uuid %s appears twice", uuids[i]), rc = -1;
    qsort(minors, s->ngpus, sizeof *minors, cmp_minor);
    for (size_t i = 1; i < s->ngpus && !rc; i++)
        if (minors[i - 1] == minors[i]) snprintf(err, ERR_LEN, "gpus: minor %u appears twice", minors[i]), rc = -1;
    free(minors);
    free(uuids);
    return rc;
}

/* One entry of a GPU's "mig_devices" (`where` names the GPU). */
static int read_mig(const struct json *o, const char *gpu_where, size_t j, const struct gpu *g, struct mig *m,
                    char *err) {
    char where[96], profile[NVML_DEVICE_NAME_V2_BUFFER_SIZE], name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    char known[NPROFILES * 16] = "";
    unsigned long long gi;
    snprintf(where, sizeof where, "%s.mig_devices[%zu]", gpu_where, j);
    if (o->type != J_OBJ) return snprintf(err, ERR_LEN, "%s: must be an object", where), -1;
    memset(m, 0, sizeof *m);
    if (get_text(o, where, "uuid", NULL, 1, m->uuid, sizeof m->uuid, err) ||
        get_text(o, where, "profile", NULL, 0, profile, sizeof profile, err) ||
        get_uint(o, where, "gi", MIG_GI_ID_MAX, (long long)j + 1, &gi, err))
        return -1;
    m->gi = (unsigned)gi;
    for (size_t i = 0; i < NPROFILES && !m->profile; i++) {
        profile_name(&mig_profiles[i], g->memory_mib, name, sizeof name);
        if (!strcmp(name, profile)) m->profile = &mig_profiles[i];
        snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "", name);
    }
    if (!m->profile)
        return field_error(err, where, "profile", "'%s' is not one of this GPU's (%llu MiB): %s", profile,
                           g->memory_mib, known);
    return 0;
}

/* "mig_enabled" (present: the GPU is MIG-capable) and "mig_devices", which must fit on one GPU. */
static int read_migs(const struct json *o, const char *where, struct gpu *g, char *err) {
    int dup = 0;
    const struct json *enabled = get(o, "mig_enabled", &dup), *list;
    unsigned slices = 0, mem_slices = 0, count[NPROFILES] = {0};
    if (dup) return field_error(err, where, "mig_enabled", "given twice");
    if (enabled && get_bool(o, where, "mig_enabled", &g->mig_enabled, err)) return -1;
    g->mig_capable = enabled != NULL;
    list = get(o, "mig_devices", &dup);
    if (dup) return field_error(err, where, "mig_devices", "given twice");
    if (!list || list->type == J_NULL) return 0;
    if (list->type != J_ARR) return field_error(err, where, "mig_devices", "must be a list");
    if (list->n && !g->mig_enabled) return field_error(err, where, "mig_devices", "needs \"mig_enabled\": true");
    if (list->n > MIG_MAX) return field_error(err, where, "mig_devices", "more than %d MIG devices", MIG_MAX);
    for (; g->nmigs < list->n; g->nmigs++) {
        struct mig *m = &g->migs[g->nmigs];
        if (read_mig(&list->items[g->nmigs], where, g->nmigs, g, m, err)) return -1;
        for (size_t k = 0; k < g->nmigs; k++)
            if (g->migs[k].gi == m->gi)
                return field_error(err, where, "mig_devices", "GPU instance %u appears twice", m->gi);
        slices += m->profile->slices, mem_slices += m->profile->mem_slices;
        if (++count[m->profile - mig_profiles] > m->profile->instances)
            return field_error(err, where, "mig_devices", "more than %u of profile %u", m->profile->instances,
                               m->profile->gi_profile);
    }
    if (slices > MIG_SLICES || mem_slices > MIG_MEMORY_SLICES)
        return field_error(err, where, "mig_devices", "needs %u compute and %u memory slices; a GPU has %d and %d",
                           slices, mem_slices, MIG_SLICES, MIG_MEMORY_SLICES);
    return 0;
}

/* The GPU model named by the "model" field (default: the A100 40 GB the mock began as). */
static int read_model(const struct json *o, const char *where, struct gpu *g, char *err) {
    char key[32], known[96] = "";
    if (get_text(o, where, "model", gpu_models[0].key, 0, key, sizeof key, err)) return -1;
    for (size_t i = 0; i < NMODELS; i++) {
        if (!strcmp(key, gpu_models[i].key)) return g->model = &gpu_models[i], 0;
        snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "", gpu_models[i].key);
    }
    return field_error(err, where, "model", "unknown GPU model \"%s\" (known: %s)", key, known);
}

static int read_gpu(const struct json *o, size_t i, struct gpu *g, char *err) {
    char where[40];
    unsigned long long minor, memory, numa;
    int dup = 0;
    const struct json *nv;
    snprintf(where, sizeof where, "gpus[%zu]", i);
    if (o->type != J_OBJ) return snprintf(err, ERR_LEN, "%s: must be an object", where), -1;
    memset(g, 0, sizeof *g);
    if (get_text(o, where, "uuid", NULL, 1, g->uuid, sizeof g->uuid, err) ||
        get_text(o, where, "name", "NVIDIA A100-SXM4-40GB", 0, g->name, sizeof g->name, err) ||
        get_uint(o, where, "minor", UINT_MAX, -1, &minor, err) ||
        get_uint(o, where, "memory_mib", MEMORY_MIB_MAX, 40960, &memory, err) ||
        get_bool(o, where, "lost", &g->lost, err) || get_bool(o, where, "fail_allocate", &(int){0}, err) ||
        read_model(o, where, g, err))
        return -1;
    g->minor = (unsigned)minor, g->memory_mib = memory;
    nv = get(o, "numa_node", &dup);
    if (nv && nv->type != J_NULL) {
        if (get_uint(o, where, "numa_node", NUMA_NODE_MAX, -1, &numa, err)) return -1;
        g->has_numa = 1, g->numa_node = (unsigned)numa;
    } else if (dup) {
        return field_error(err, where, "numa_node", "given twice");
    }
    return read_migs(o, where, g, err);
}

/* An Xid ("xid") or an uncorrectable ECC error ("ecc": "uncorrected"). */
static int read_event(const struct json *o, size_t i, struct xid_event *e, char *err) {
    static const char uncorrected[] = "uncorrected";
    char where[40];
    int dup = 0;
    const struct json *xid, *ecc;
    snprintf(where, sizeof where, "events[%zu]", i);
    if (o->type != J_OBJ) return snprintf(err, ERR_LEN, "%s: must be an object", where), -1;
    if (get_text(o, where, "uuid", NULL, 1, e->uuid, sizeof e->uuid, err)) return -1;
    xid = get(o, "xid", &dup), ecc = get(o, "ecc", &dup);
    if (!xid == !ecc)
        return snprintf(err, ERR_LEN, "%s: needs either \"xid\" (an Xid number) or \"ecc\": \"uncorrected\"%s", where,
                        xid ? ", not both" : ""), -1;
    if (xid) return get_uint(o, where, "xid", ULLONG_MAX, -1, &e->xid, err);
    if (dup) return field_error(err, where, "ecc", "given twice");
    if (ecc->type != J_STR || ecc->len != sizeof uncorrected - 1 || memcmp(ecc->str, uncorrected, ecc->len))
        return field_error(err, where, "ecc", "must be \"uncorrected\" (the ECC error the mock has)");
    e->ecc = 1, e->xid = XID_DBE;
    return 0;
}

static int cmp_gpu_uuid(const void *key, const void *gpu) {
    return strcmp(key, (*(struct gpu *const *)gpu)->uuid);
}

static int cmp_gpus(const void *a, const void *b) { return cmp_gpu_uuid((*(struct gpu *const *)a)->uuid, b); }

/* Each GPU's uncorrected ECC count: the ECC entries naming it (a sorted index: 10,000 GPUs stay cheap). */
static int count_ecc(struct state *s, char *err) {
    struct gpu **by_uuid, **hit;
    size_t necc = 0;
    for (size_t i = 0; i < s->nevents; i++) necc += (size_t)s->events[i].ecc;
    if (!necc || !s->ngpus) return 0;
    by_uuid = malloc(s->ngpus * sizeof *by_uuid);
    if (!by_uuid) return snprintf(err, ERR_LEN, "out of memory"), -1;
    for (size_t i = 0; i < s->ngpus; i++) by_uuid[i] = &s->gpus[i];
    qsort(by_uuid, s->ngpus, sizeof *by_uuid, cmp_gpus);
    for (size_t i = 0; i < s->nevents; i++)
        if (s->events[i].ecc && (hit = bsearch(s->events[i].uuid, by_uuid, s->ngpus, sizeof *by_uuid, cmp_gpu_uuid)))
            (*hit)->ecc_uncorrected++;
    free(by_uuid);
    return 0;
}

/* Parse a whole state document; on error *s is empty and err says what and where. */
static int parse_state(const char *text, size_t len, struct state *s, char *err) {
    struct parser ps = {(const unsigned char *)text, (const unsigned char *)text, (const unsigned char *)text + len, 0, ""};
    struct json doc = {0};
    const struct json *gpus, *events;
    int dup = 0, rc = -1;
    memset(s, 0, sizeof *s);
    err[0] = '\0';
    if (parse_value(&ps, &doc)) goto out;
    skip_ws(&ps);
    if (ps.p != ps.end) {
        fail(&ps, "trailing data after the document");
        goto out;
    }
    if (doc.type != J_OBJ) {
        snprintf(err, ERR_LEN, "the document must be a JSON object");
        goto done;
    }
    gpus = get(&doc, "gpus", &dup);
    if (!dup) events = get(&doc, "events", &dup);
    if (dup) {
        snprintf(err, ERR_LEN, "a top-level key is given twice");
        goto done;
    }
    if (!gpus || gpus->type != J_ARR) {
        snprintf(err, ERR_LEN, "'gpus' must be a list");
        goto done;
    }
    if (events && events->type != J_ARR && events->type != J_NULL) {
        snprintf(err, ERR_LEN, "'events' must be a list");
        goto done;
    }
    s->gpus = calloc(gpus->n ? gpus->n : 1, sizeof *s->gpus);
    s->events = calloc(events && events->n ? events->n : 1, sizeof *s->events);
    if (!s->gpus || !s->events) {
        snprintf(err, ERR_LEN, "out of memory");
        goto done;
    }
    for (; s->ngpus < gpus->n; s->ngpus++)
        if (read_gpu(&gpus->items[s->ngpus], s->ngpus, &s->gpus[s->ngpus], err)) goto done;
    for (; events && s->nevents < events->n; s->nevents++)
        if (read_event(&events->items[s->nevents], s->nevents, &s->events[s->nevents], err)) goto done;
    rc = check_unique(s, err) ? -1 : count_ecc(s, err);
    goto done;
out:
    snprintf(err, ERR_LEN, "%s", ps.err);
done:
    json_free(&doc);
    if (rc) state_free(s);
    return rc;
}

/* ---- devices (handles), event sets, and the library's state ---------------------------------- */
#define DEVICE_MAGIC 0x6e766d6cU /* "nvml" */

#define INSTANCE_MAGIC 0x6d696769U /* "migi" */

/* A MIG device's GPU instance and compute instance (one each), kept inside its handle. */
struct nvmlGpuInstance_st {
    unsigned magic;
    nvmlDevice_t mig;
};

struct nvmlComputeInstance_st {
    unsigned magic;
    nvmlDevice_t mig;
};

/* A GPU, or a MIG device (parent set). Handles are never freed: a device keeps its handle by UUID. */
struct nvmlDevice_st {
    unsigned magic;
    struct gpu gpu;             /* a GPU: as the current state lists it */
    unsigned index;             /* a GPU: its position in the current state; a MIG device: on its GPU */
    int present;                /* listed in the current state */
    unsigned lost_epoch;        /* a GPU: bumped each time it becomes lost */
    nvmlDevice_t parent;        /* a MIG device: its GPU; NULL for a GPU */
    struct mig mig;             /* a MIG device: as its GPU lists it */
    nvmlDevice_t migs[MIG_MAX]; /* a GPU: its MIG devices' handles, gpu.nmigs of them in its list's order */
    struct nvmlGpuInstance_st gi;
    struct nvmlComputeInstance_st ci;
};

static const char *device_uuid(const struct nvmlDevice_st *d) { return d->parent ? d->mig.uuid : d->gpu.uuid; }

/* The GPU a handle stands for or is a MIG device of. */
static nvmlDevice_t gpu_of(nvmlDevice_t d) { return d->parent ? d->parent : d; }

struct registration {
    nvmlDevice_t device;
    unsigned long long types;
    unsigned lost_epoch_seen;
};

struct nvmlEventSet_st {
    struct nvmlEventSet_st *next;
    struct registration *regs;
    size_t nregs, cap;
    size_t cursor; /* next entry of the event log this set looks at */
};

struct logged_event {
    nvmlDevice_t device;
    unsigned long long type, data; /* nvmlEventData_t's eventType and eventData */
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER; /* guards everything below */
static pthread_cond_t changed;                         /* broadcast on every new state / shutdown */
static int initialized;
static nvmlDevice_t *devices; /* every device ever seen, by first appearance; never freed (stable handles) */
static size_t ndevices, devices_cap;
static nvmlDevice_t *order; /* the current state's devices, in its order */
static size_t norder;
static size_t events_seen; /* entries of "events" already taken (delivered or history) */
static struct logged_event *event_log;
static size_t nlog, log_cap;
static size_t init_log_start; /* the log's length at the last nvmlInit: where new sets start */
static char loaded_path[4096]; /* the state file this process read last ("" before the first) */
static struct nvmlEventSet_st *sets;
static char last_error[ERR_LEN];

static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER; /* guards refcount and the watcher */
static unsigned refcount;
static pthread_t watcher;
static int watch_fd = -1, wake_pipe[2] = {-1, -1};

/* Say what is wrong with the state file, once per distinct problem. */
static void report(const char *path, const char *problem, int first) {
    char line[ERR_LEN];
    snprintf(line, sizeof line, "%s", problem);
    if (!strcmp(line, last_error)) return;
    memcpy(last_error, line, sizeof line);
    fprintf(stderr, "mock libnvidia-ml: %s: %s; %s\n", path ? path : "(no state file)", line,
            first ? "nvmlInit fails with NVML_ERROR_DRIVER_NOT_LOADED" : "keeping the last good state");
}

static int cmp_device_uuid(const void *a, const void *b) {
    return strcmp(device_uuid(*(const nvmlDevice_t *)a), device_uuid(*(const nvmlDevice_t *)b));
}

/* The device already known for uuid, through `sorted` (`known` handles ordered by UUID), else a new one in
 * devices[] (NULL when out of memory). */
static nvmlDevice_t device_for(nvmlDevice_t *sorted, size_t known, const char *uuid) {
    static struct nvmlDevice_st key;
    nvmlDevice_t keyp = &key, *hit, d;
    memcpy(key.gpu.uuid, uuid, sizeof key.gpu.uuid);
    hit = known ? bsearch(&keyp, sorted, known, sizeof *sorted, cmp_device_uuid) : NULL;
    if (hit) return *hit;
    d = calloc(1, sizeof *d);
    if (!d) return NULL;
    d->magic = DEVICE_MAGIC;
    devices[ndevices++] = d;
    return d;
}

/* Adopt a parsed state (mu held): devices keep their handles; appended events join the log. */
static int apply_state(struct state *s, int fresh) {
    nvmlDevice_t *new_order = calloc(s->ngpus ? s->ngpus : 1, sizeof *new_order);
    nvmlDevice_t *sorted = malloc((ndevices ? ndevices : 1) * sizeof *sorted);
    size_t known = ndevices, wanted = ndevices;
    if (!new_order || !sorted) return free(new_order), free(sorted), -1;
    for (size_t i = 0; i < s->ngpus; i++) wanted += 1 + s->gpus[i].nmigs;
    if (wanted > devices_cap) {
        size_t ncap = devices_cap ? devices_cap : 16;
        while (ncap < wanted) ncap *= 2;
        nvmlDevice_t *grown = realloc(devices, ncap * sizeof *grown);
        if (!grown) return free(new_order), free(sorted), -1;
        devices = grown, devices_cap = ncap;
    }
    if (ndevices) memcpy(sorted, devices, ndevices * sizeof *sorted);
    qsort(sorted, ndevices, sizeof *sorted, cmp_device_uuid);
    for (size_t i = 0; i < ndevices; i++) devices[i]->present = 0;
    for (size_t i = 0; i < s->ngpus; i++) {
        nvmlDevice_t d = device_for(sorted, known, s->gpus[i].uuid);
        if (!d) break;
        if (s->gpus[i].lost && (d->parent || !d->gpu.lost)) d->lost_epoch++;
        d->gpu = s->gpus[i], d->index = (unsigned)i, d->present = 1, d->parent = NULL;
        for (size_t j = 0; j < d->gpu.nmigs; j++) {
            nvmlDevice_t m = device_for(sorted, known, d->gpu.migs[j].uuid);
            if (!m) {
                d->gpu.nmigs = j; /* out of memory: the MIG devices that have handles */
                break;
            }
            memset(&m->gpu, 0, sizeof m->gpu);
            m->mig = d->gpu.migs[j], m->index = (unsigned)j, m->present = 1, m->parent = d;
            m->gi.magic = m->ci.magic = INSTANCE_MAGIC, m->gi.mig = m->ci.mig = m;
            d->migs[j] = m;
        }
        new_order[i] = d;
    }
    free(sorted);
    free(order);
    order = new_order, norder = s->ngpus;
    for (size_t i = 0; i < norder; i++)
        if (!order[i]) return norder = i, -1; /* out of memory part-way: keep what is consistent */

    if (fresh) nlog = init_log_start = 0; /* another file: another machine, its events are history */
    if (fresh || s->nevents < events_seen) {
        if (!fresh)
            fprintf(stderr, "mock libnvidia-ml: events shrank from %zu to %zu entries (the list is append-only); "
                            "only entries appended from now on are delivered\n", events_seen, s->nevents);
        events_seen = s->nevents; /* what is there already is history */
    }
    for (; events_seen < s->nevents; events_seen++) {
        const struct xid_event *e = &s->events[events_seen];
        nvmlDevice_t d = NULL;
        for (size_t i = 0; i < norder && !d; i++)
            if (!strcmp(order[i]->gpu.uuid, e->uuid)) d = order[i];
        if (!d) {
            if (e->ecc)
                fprintf(stderr, "mock libnvidia-ml: events[%zu]: ECC error names %s, which is not in gpus; dropped\n",
                        events_seen, e->uuid);
            else
                fprintf(stderr, "mock libnvidia-ml: events[%zu]: Xid %llu names %s, which is not in gpus; dropped\n",
                        events_seen, e->xid, e->uuid);
            continue;
        }
        if (nlog + 2 > log_cap) { /* room for an ECC entry's two events */
            size_t ncap = log_cap ? log_cap * 2 : 16;
            struct logged_event *grown = realloc(event_log, ncap * sizeof *grown);
            if (!grown) return -1;
            event_log = grown, log_cap = ncap;
        }
        if (e->ecc) event_log[nlog++] = (struct logged_event){d, nvmlEventTypeDoubleBitEccError, 0};
        event_log[nlog++] = (struct logged_event){d, nvmlEventTypeXidCriticalError, e->xid};
    }
    pthread_cond_broadcast(&changed);
    return 0;
}

static const char *state_path(void) {
    const char *p = getenv("DEVPLUG_NVML_STATE");
    return p && *p ? p : NULL;
}

/* Read, parse and adopt the state file; problems are reported once and leave the state as it was. */
static int load_locked(int at_init) {
    const char *path = state_path();
    int first = at_init; /* for report(): whether nvmlInit fails on this problem */
    char err[ERR_LEN];
    struct state s;
    char *text = NULL;
    long size = 0;
    FILE *f;
    int rc = -1;
    if (!path) {
        report(NULL, "DEVPLUG_NVML_STATE is not set (it names the mock-state JSON file)", first);
        return -1;
    }
    f = fopen(path, "rb");
    if (!f) {
        snprintf(err, sizeof err, "cannot read: %s", strerror(errno));
        report(path, err, first);
        return -1;
    }
    text = malloc(STATE_MAX_BYTES + 1);
    if (text) size = (long)fread(text, 1, STATE_MAX_BYTES + 1, f);
    fclose(f);
    if (!text) {
        report(path, "out of memory", first);
        return -1;
    }
    if (size > STATE_MAX_BYTES) {
        report(path, "larger than 64 MiB", first);
    } else if (parse_state(text, (size_t)size, &s, err)) {
        report(path, err, first);
    } else {
        pthread_mutex_lock(&mu);
        rc = apply_state(&s, strcmp(path, loaded_path) != 0);
        if (!rc) snprintf(loaded_path, sizeof loaded_path, "%s", path);
        if (rc) report(path, "out of memory", first);
        else last_error[0] = '\0';
        pthread_mutex_unlock(&mu);
        state_free(&s);
    }
    free(text);
    return rc;
}

/* One load at a time: the watcher's read of a newer file must not be adopted before nvmlInit's older one. */
static int load(int at_init) {
    static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&load_mu);
    int rc = load_locked(at_init);
    pthread_mutex_unlock(&load_mu);
    return rc;
}

/* The state file's identity and last change, for the watcher without inotify. */
static void file_stamp(const char *path, struct stat *st) {
    if (stat(path, st)) memset(st, 0, sizeof *st);
}

static int same_stamp(const struct stat *a, const struct stat *b) {
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino && a->st_size == b->st_size &&
           a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

/* The watcher: sleeps in poll() until the state file's directory changes or shutdown wakes it. Without
 * inotify (the user's inotify instances used up) it looks at the file's stat every 100 ms instead. */
static void *watch_loop(void *arg) {
    const char *path = state_path(), *name = arg;
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    struct stat seen, now;
    file_stamp(path, &seen);
    for (;;) {
        struct pollfd fds[2] = {{wake_pipe[0], POLLIN, 0}, {watch_fd, POLLIN, 0}};
        int ready = poll(fds, watch_fd >= 0 ? 2 : 1, watch_fd >= 0 ? -1 : 100);
        if (ready < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (fds[0].revents) break;
        int ours = 0;
        if (watch_fd < 0) {
            file_stamp(path, &now);
            ours = !same_stamp(&seen, &now), seen = now;
        } else {
            ssize_t n = read(watch_fd, buf, sizeof buf);
            for (char *p = buf; n > 0 && p < buf + n;) {
                struct inotify_event *ev = (struct inotify_event *)p;
                if (ev->len && !strcmp(ev->name, name)) ours = 1;
                p += sizeof *ev + ev->len;
            }
        }
        if (ours) load(0);
    }
    return NULL;
}

/* Armed before nvmlInit reads the file, so a change written between that read and the watch is not missed
 * (a re-read of the same state is harmless). */
static void start_watching(void) {
    const char *path = state_path();
    static char dir[4096], name[256];
    if (!path) return;
    const char *slash = strrchr(path, '/');
    if (slash) {
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path) ? (int)(slash - path) : 1, path);
        snprintf(name, sizeof name, "%s", slash + 1);
    } else {
        snprintf(dir, sizeof dir, ".");
        snprintf(name, sizeof name, "%s", path);
    }
    if (pipe2(wake_pipe, O_CLOEXEC) < 0) {
        fprintf(stderr, "mock libnvidia-ml: cannot watch %s (%s); later changes of the state are not seen\n", path,
                strerror(errno));
        wake_pipe[0] = wake_pipe[1] = -1;
        return;
    }
    watch_fd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    if (watch_fd >= 0 && inotify_add_watch(watch_fd, dir, IN_CLOSE_WRITE | IN_MOVED_TO) < 0) {
        close(watch_fd);
        watch_fd = -1;
    }
    if (pthread_create(&watcher, NULL, watch_loop, name)) {
        fprintf(stderr, "mock libnvidia-ml: cannot start a thread watching %s; later changes of the state are not seen\n",
                path);
        if (watch_fd >= 0) close(watch_fd);
        close(wake_pipe[0]), close(wake_pipe[1]);
        watch_fd = wake_pipe[0] = wake_pipe[1] = -1;
    }
}

static void stop_watching(void) {
    if (wake_pipe[1] < 0) return;
    if (write(wake_pipe[1], "x", 1) == 1) pthread_join(watcher, NULL);
    if (watch_fd >= 0) close(watch_fd);
    close(wake_pipe[0]), close(wake_pipe[1]);
    watch_fd = wake_pipe[0] = wake_pipe[1] = -1;
}

__attribute__((constructor)) static void setup(void) {
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&changed, &attr);
    pthread_condattr_destroy(&attr);
}

/* ---- the NVML API ---------------------------------------------------------------------------- */
API nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&init_mu);
    if (refcount == 0) {
        last_error[0] = '\0'; /* each start says what is wrong with the file */
        pthread_mutex_lock(&mu);
        init_log_start = nlog;
        pthread_mutex_unlock(&mu);
        start_watching();
        if (load(1)) {
            stop_watching();
            pthread_mutex_unlock(&init_mu);
            return NVML_ERROR_DRIVER_NOT_LOADED;
        }
        pthread_mutex_lock(&mu);
        initialized = 1;
        pthread_mutex_unlock(&mu);
    }
    refcount++;
    pthread_mutex_unlock(&init_mu);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

API nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&init_mu);
    if (refcount == 0) {
        pthread_mutex_unlock(&init_mu);
        return NVML_ERROR_UNINITIALIZED;
    }
    if (--refcount == 0) {
        stop_watching();
        pthread_mutex_lock(&mu);
        initialized = 0;
        pthread_cond_broadcast(&changed); /* waiters return NVML_ERROR_UNINITIALIZED */
        pthread_mutex_unlock(&mu);
    }
    pthread_mutex_unlock(&init_mu);
    return NVML_SUCCESS;
}

API const char *nvmlErrorString(nvmlReturn_t result) {
    switch ((int)result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

static nvmlReturn_t copy_text(char *out, unsigned int length, const char *value) {
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, value, strlen(value) + 1);
    return NVML_SUCCESS;
}

static nvmlReturn_t system_text(char *out, unsigned int length, const char *value) {
    pthread_mutex_lock(&mu);
    nvmlReturn_t rc = initialized ? copy_text(out, length, value) : NVML_ERROR_UNINITIALIZED;
    pthread_mutex_unlock(&mu);
    return rc;
}

API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    return system_text(version, length, MOCK_DRIVER_VERSION);
}

API nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    return system_text(version, length, MOCK_NVML_VERSION);
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    if (!version) return NVML_ERROR_INVALID_ARGUMENT;
    *version = MOCK_CUDA_DRIVER_VERSION;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) { return nvmlSystemGetCudaDriverVersion(version); }

API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&mu);
    nvmlReturn_t rc = initialized ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (!rc) *count = (unsigned)norder;
    pthread_mutex_unlock(&mu);
    return rc;
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!device) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&mu);
    nvmlReturn_t rc = !initialized ? NVML_ERROR_UNINITIALIZED : index >= norder ? NVML_ERROR_INVALID_ARGUMENT : NVML_SUCCESS;
    if (!rc) *device = order[index];
    pthread_mutex_unlock(&mu);
    return rc;
}

/* A GPU's or a MIG device's handle (MIG devices by UUID, as drivers from R470 on answer). */
API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    if (!uuid || !device) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&mu);
    nvmlReturn_t rc = initialized ? NVML_ERROR_NOT_FOUND : NVML_ERROR_UNINITIALIZED;
    for (size_t i = 0; rc == NVML_ERROR_NOT_FOUND && i < norder; i++) {
        if (!strncmp(order[i]->gpu.uuid, uuid, NVML_DEVICE_UUID_V2_BUFFER_SIZE)) *device = order[i], rc = NVML_SUCCESS;
        for (size_t j = 0; rc == NVML_ERROR_NOT_FOUND && j < order[i]->gpu.nmigs; j++)
            if (!strncmp(order[i]->migs[j]->mig.uuid, uuid, NVML_DEVICE_UUID_V2_BUFFER_SIZE))
                *device = order[i]->migs[j], rc = NVML_SUCCESS;
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

static int valid_device(nvmlDevice_t d) { return d && d->magic == DEVICE_MAGIC && d->present; }

/* Lock and check a device handle: a removed GPU or MIG device is an invalid handle, a lost GPU and its MIG
 * devices answer LOST. */
static nvmlReturn_t enter(nvmlDevice_t device) {
    pthread_mutex_lock(&mu);
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!valid_device(device)) return NVML_ERROR_INVALID_ARGUMENT;
    if (gpu_of(device)->gpu.lost) return NVML_ERROR_GPU_IS_LOST;
    return NVML_SUCCESS;
}

/* enter() for calls that only a GPU answers (NOT_SUPPORTED on a MIG device). */
static nvmlReturn_t enter_gpu(nvmlDevice_t device) {
    nvmlReturn_t rc = enter(device);
    return !rc && device->parent ? NVML_ERROR_NOT_SUPPORTED : rc;
}

static nvmlReturn_t leave(nvmlReturn_t rc) {
    pthread_mutex_unlock(&mu);
    return rc;
}

API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    nvmlReturn_t rc = enter(device);
    return leave(rc ? rc : copy_text(uuid, length, device_uuid(device)));
}

/* A MIG device is named for its GPU and profile: "NVIDIA A100-SXM4-40GB MIG 1g.5gb". */
API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    char text[2 * NVML_DEVICE_NAME_V2_BUFFER_SIZE + 8], profile[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    nvmlReturn_t rc = enter(device);
    if (rc) return leave(rc);
    if (!device->parent) return leave(copy_text(name, length, device->gpu.name));
    profile_name(device->mig.profile, device->parent->gpu.memory_mib, profile, sizeof profile);
    snprintf(text, sizeof text, "%s MIG %s", device->parent->gpu.name, profile);
    return leave(copy_text(name, length, text));
}

API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    nvmlReturn_t rc = enter_gpu(device);
    if (!rc && !index) rc = NVML_ERROR_INVALID_ARGUMENT;
    if (!rc) *index = device->index;
    return leave(rc);
}

API nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor) {
    nvmlReturn_t rc = enter_gpu(device);
    if (!rc && !minor) rc = NVML_ERROR_INVALID_ARGUMENT;
    if (!rc) *minor = device->gpu.minor;
    return leave(rc);
}

/* A GPU's memory, or a MIG device's share of its GPU's (mu held). */
static unsigned long long memory_bytes(nvmlDevice_t device) {
    if (!device->parent) return device->gpu.memory_mib << 20;
    return profile_memory_mib(device->mig.profile, device->parent->gpu.memory_mib) << 20;
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    nvmlReturn_t rc = enter(device);
    if (!rc && !memory) rc = NVML_ERROR_INVALID_ARGUMENT;
    if (!rc) memory->total = memory->free = memory_bytes(device), memory->used = 0;
    return leave(rc);
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    nvmlReturn_t rc = enter(device);
    if (!rc && !memory) rc = NVML_ERROR_INVALID_ARGUMENT;
    if (!rc && memory->version != nvmlMemory_v2) rc = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (!rc) memory->total = memory->free = memory_bytes(device), memory->reserved = memory->used = 0;
    return leave(rc);
}

API nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int *node) {
    nvmlReturn_t rc = enter(device);
    if (!rc && !node) rc = NVML_ERROR_INVALID_ARGUMENT;
    if (!rc && !gpu_of(device)->gpu.has_numa) rc = NVML_ERROR_NOT_SUPPORTED;
    if (!rc) *node = gpu_of(device)->gpu.numa_node;
    return leave(rc);
}

/* A made-up but valid PCI address per minor, on a PCI domain of the mock's own so that it names none of the host's
 * devices (the mock GPU node's sysfs shows the GPUs there: sim/gpunode.py's gpu_pci_address): bus and device taken
 * from the minor's bits, its high bits added to the domain (a MIG device's address is its GPU's). */
#define MOCK_PCI_DOMAIN 0x10DEU
static nvmlReturn_t pci_info(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    nvmlReturn_t rc = enter(device);
    if (!rc && !pci) rc = NVML_ERROR_INVALID_ARGUMENT;
    if (!rc) {
        unsigned m = gpu_of(device)->gpu.minor;
        memset(pci, 0, sizeof *pci);
        pci->domain = MOCK_PCI_DOMAIN + (m >> 13), pci->bus = (m >> 5) & 0xFF, pci->device = m & 0x1F;
        pci->pciDeviceId = gpu_of(device)->gpu.model->pci_device_id, pci->pciSubSystemId = 0x145F10DEU;
        snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.0", pci->domain, pci->bus, pci->device);
        snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.0", pci->domain & 0xFFFF, pci->bus,
                 pci->device);
    }
    return leave(rc);
}

API nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci) { return pci_info(device, pci); }
API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) { return pci_info(device, pci); }

API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    nvmlReturn_t rc = enter(device);
    if (!rc && (!major || !minor)) rc = NVML_ERROR_INVALID_ARGUMENT;
    if (!rc) *major = (int)gpu_of(device)->gpu.model->cc_major, *minor = (int)gpu_of(device)->gpu.model->cc_minor;
    return leave(rc);
}

API nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, unsigned int *arch) {
    nvmlReturn_t rc = enter(device);
    if (!rc && !arch) rc = NVML_ERROR_INVALID_ARGUMENT;
    if (!rc) *arch = gpu_of(device)->gpu.model->arch;
    return leave(rc);
}

API nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, int *type) {
    nvmlReturn_t rc = enter(device);
    if (!rc && !type) rc = NVML_ERROR_INVALID_ARGUMENT;
    if (!rc) *type = NVML_BRAND_NVIDIA;
    return leave(rc);
}

/* PCIe-only GPUs (no NVLink): the same NUMA node is NODE, anything else SYSTEM. */
API nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1, nvmlDevice_t device2, int *pathInfo) {
    nvmlReturn_t rc = enter_gpu(device1);
    if (rc) return leave(rc);
    if (!valid_device(device2) || !pathInfo) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (device2->parent) return leave(NVML_ERROR_NOT_SUPPORTED);
    if (device2->gpu.lost) return leave(NVML_ERROR_GPU_IS_LOST);
    if (device1 == device2) *pathInfo = NVML_TOPOLOGY_INTERNAL;
    else if (device1->gpu.has_numa && device2->gpu.has_numa && device1->gpu.numa_node == device2->gpu.numa_node)
        *pathInfo = NVML_TOPOLOGY_NODE;
    else *pathInfo = NVML_TOPOLOGY_SYSTEM;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, int *isActive) {
    nvmlReturn_t rc = enter(device);
    (void)link;
    if (!rc && !isActive) rc = NVML_ERROR_INVALID_ARGUMENT;
    return leave(rc ? rc : NVML_ERROR_NOT_SUPPORTED);
}

/* ---- NVLink fabric ------------------------------------------------------------------------------------ */
/* The Hopper and newer models (H100, H200, B200) are HGX boards on an NVLink fabric: NVIDIA's Fabric Manager has
 * registered every GPU (probe state COMPLETED, status SUCCESS, healthy), all in one cluster and clique, which NVIDIA's
 * DRA driver joins into the node's ComputeDomain clique ID ("<cluster UUID>.<clique ID>"). Older GPUs (the A100s)
 * answer NOT_SUPPORTED (NVML: "for Hopper or newer fully supported devices"), and so does a MIG device. */
#define NVML_GPU_FABRIC_UUID_LEN 16
#define NVML_GPU_FABRIC_STATE_COMPLETED 3
#define NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY 1
/* Each field of the health mask at its good value: degraded bandwidth, route recovery, route unhealthy and access
 * timeout recovery FALSE (2, at bits 0, 2, 4, 6), incorrect configuration NONE (1, at bit 8). */
#define MOCK_FABRIC_HEALTH_MASK (2U | 2U << 2 | 2U << 4 | 2U << 6 | 1U << 8)
#define MOCK_FABRIC_CLIQUE_ID 1U
/* The node's NVLink cluster, f2a3b4c5-d6e7-4f80-9a1b-2c3d4e5f6a7b (Fabric Manager's UUID for it; any non-zero one). */
static const unsigned char fabric_cluster_uuid[NVML_GPU_FABRIC_UUID_LEN] = {
    0xf2, 0xa3, 0xb4, 0xc5, 0xd6, 0xe7, 0x4f, 0x80, 0x9a, 0x1b, 0x2c, 0x3d, 0x4e, 0x5f, 0x6a, 0x7b};

typedef unsigned char nvmlGpuFabricState_t;

typedef struct {
    unsigned char clusterUuid[NVML_GPU_FABRIC_UUID_LEN];
    nvmlReturn_t status;
    unsigned int cliqueId;
    nvmlGpuFabricState_t state;
} nvmlGpuFabricInfo_t;

typedef struct {
    unsigned int version;
    unsigned char clusterUuid[NVML_GPU_FABRIC_UUID_LEN];
    nvmlReturn_t status;
    unsigned int cliqueId;
    nvmlGpuFabricState_t state;
    unsigned int healthMask;
} nvmlGpuFabricInfo_v2_t;

typedef struct { /* v2 and healthSummary: v2 is its prefix */
    unsigned int version;
    unsigned char clusterUuid[NVML_GPU_FABRIC_UUID_LEN];
    nvmlReturn_t status;
    unsigned int cliqueId;
    nvmlGpuFabricState_t state;
    unsigned int healthMask;
    unsigned char healthSummary;
} nvmlGpuFabricInfo_v3_t;
#define nvmlGpuFabricInfo_v2 NVML_STRUCT_VERSION(GpuFabricInfo, 2)
#define nvmlGpuFabricInfo_v3 NVML_STRUCT_VERSION(GpuFabricInfo, 3)

/* enter() for the fabric calls: a GPU of Hopper or newer, and somewhere to write the answer. */
static nvmlReturn_t enter_fabric(nvmlDevice_t device, const void *info) {
    nvmlReturn_t rc = enter_gpu(device);
    if (!rc && !info) rc = NVML_ERROR_INVALID_ARGUMENT;
    if (!rc && device->gpu.model->arch < NVML_DEVICE_ARCH_HOPPER) rc = NVML_ERROR_NOT_SUPPORTED;
    return rc;
}

API nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device, nvmlGpuFabricInfo_t *info) {
    nvmlReturn_t rc = enter_fabric(device, info);
    if (!rc) {
        memset(info, 0, sizeof *info);
        memcpy(info->clusterUuid, fabric_cluster_uuid, sizeof info->clusterUuid);
        info->status = NVML_SUCCESS, info->cliqueId = MOCK_FABRIC_CLIQUE_ID, info->state = NVML_GPU_FABRIC_STATE_COMPLETED;
    }
    return leave(rc);
}

/* The caller says which version its struct is (v2 or v3); a v2 caller's struct gets no healthSummary. */
API nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, nvmlGpuFabricInfo_v3_t *info) {
    nvmlReturn_t rc = enter_fabric(device, info);
    if (!rc && info->version != nvmlGpuFabricInfo_v2 && info->version != nvmlGpuFabricInfo_v3)
        rc = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (!rc) {
        unsigned int version = info->version;
        memset(info, 0, version == nvmlGpuFabricInfo_v3 ? sizeof(nvmlGpuFabricInfo_v3_t) : sizeof(nvmlGpuFabricInfo_v2_t));
        info->version = version;
        memcpy(info->clusterUuid, fabric_cluster_uuid, sizeof info->clusterUuid);
        info->status = NVML_SUCCESS, info->cliqueId = MOCK_FABRIC_CLIQUE_ID, info->state = NVML_GPU_FABRIC_STATE_COMPLETED;
        info->healthMask = MOCK_FABRIC_HEALTH_MASK;
        if (version == nvmlGpuFabricInfo_v3) info->healthSummary = NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY;
    }
    return leave(rc);
}

/* ---- MIG ---------------------------------------------------------------------------------------------- */
API nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending) {
    nvmlReturn_t rc = enter_gpu(device);
    if (!rc && (!current || !pending)) rc = NVML_ERROR_INVALID_ARGUMENT;
    if (!rc && !device->gpu.mig_capable) rc = NVML_ERROR_NOT_SUPPORTED;
    if (!rc) *current = *pending = device->gpu.mig_enabled ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
    return leave(rc);
}

/* enter() for calls that only a MIG-capable GPU answers. */
static nvmlReturn_t enter_mig_capable(nvmlDevice_t device) {
    nvmlReturn_t rc = enter_gpu(device);
    return !rc && !device->gpu.mig_capable ? NVML_ERROR_NOT_SUPPORTED : rc;
}

/* enter() for calls that only a MIG device answers. */
static nvmlReturn_t enter_mig(nvmlDevice_t device) {
    nvmlReturn_t rc = enter(device);
    return !rc && !device->parent ? NVML_ERROR_NOT_SUPPORTED : rc;
}

API nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    nvmlReturn_t rc = enter_mig_capable(device);
    if (!rc && !count) rc = NVML_ERROR_INVALID_ARGUMENT;
    if (!rc) *count = MIG_MAX;
    return leave(rc);
}

API nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *migDevice) {
    nvmlReturn_t rc = enter_mig_capable(device);
    if (!rc && (!migDevice || index >= MIG_MAX)) rc = NVML_ERROR_INVALID_ARGUMENT;
    if (!rc && index >= device->gpu.nmigs) rc = NVML_ERROR_NOT_FOUND;
    if (!rc) *migDevice = device->migs[index];
    return leave(rc);
}

API nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice) {
    nvmlReturn_t rc = enter(device);
    if (!rc && !isMigDevice) rc = NVML_ERROR_INVALID_ARGUMENT;
    if (!rc) *isMigDevice = device->parent != NULL;
    return leave(rc);
}

API nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t *device) {
    nvmlReturn_t rc = enter(migDevice);
    if (!rc && (!device || !migDevice->parent)) rc = NVML_ERROR_INVALID_ARGUMENT;
    if (!rc) *device = migDevice->parent;
    return leave(rc);
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    nvmlReturn_t rc = enter_mig(device);
    if (!rc && !id) rc = NVML_ERROR_INVALID_ARGUMENT;
    if (!rc) *id = device->mig.gi;
    return leave(rc);
}

API nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
    nvmlReturn_t rc = enter_mig(device);
    if (!rc && !id) rc = NVML_ERROR_INVALID_ARGUMENT;
    if (!rc) *id = 0;
    return leave(rc);
}

/* A MIG device's share of its GPU (a GPU's own: all of it); engine counts grow with the slices. */
API nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes) {
    nvmlReturn_t rc = enter(device);
    if (!rc && !attributes) rc = NVML_ERROR_INVALID_ARGUMENT;
    if (!rc) {
        unsigned slices = device->parent ? device->mig.profile->slices : MIG_SLICES;
        memset(attributes, 0, sizeof *attributes);
        const struct gpu_model *model = gpu_of(device)->gpu.model;
        attributes->multiprocessorCount = device->parent ? model->sms_per_slice * slices : model->sms;
        attributes->sharedCopyEngineCount = slices;
        attributes->sharedDecoderCount = (slices + 1) / 2;
        attributes->sharedJpegCount = slices == MIG_SLICES;
        attributes->sharedOfaCount = slices == MIG_SLICES;
        attributes->gpuInstanceSliceCount = attributes->computeInstanceSliceCount = slices;
        attributes->memorySizeMB = memory_bytes(device) >> 20;
    }
    return leave(rc);
}

/* A GPU instance profile of a MIG-capable GPU; NOT_SUPPORTED for those an A100 lacks. */
API nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile,
                                                     nvmlGpuInstanceProfileInfo_t *info) {
    nvmlReturn_t rc = enter_mig_capable(device);
    const struct mig_profile *p = gi_profile(profile);
    if (!rc && (!info || profile >= NVML_GPU_INSTANCE_PROFILE_COUNT)) rc = NVML_ERROR_INVALID_ARGUMENT;
    if (!rc && !p) rc = NVML_ERROR_NOT_SUPPORTED;
    if (!rc) {
        memset(info, 0, sizeof *info);
        info->id = profile, info->sliceCount = p->slices, info->instanceCount = p->instances;
        info->multiprocessorCount = device->gpu.model->sms_per_slice * p->slices;
        info->copyEngineCount = p->slices, info->decoderCount = (p->slices + 1) / 2;
        info->jpegCount = info->ofaCount = p->slices == MIG_SLICES;
        info->memorySizeMB = profile_memory_mib(p, device->gpu.memory_mib);
    }
    return leave(rc);
}

/* Where a GPU instance of profile p may start, in memory slices (NVIDIA's MIG user guide, A100 placements): at a
 * multiple of its memory size, its compute slices within the first MIG_SLICES; at most max written to out (NULL:
 * none). Returns how many there are. */
static unsigned gi_placements(const struct mig_profile *p, nvmlGpuInstancePlacement_t *out, unsigned max) {
    unsigned n = 0;
    for (unsigned start = 0; start + p->slices <= MIG_SLICES && start + p->mem_slices <= MIG_MEMORY_SLICES;
         start += p->mem_slices, n++)
        if (out && n < max) out[n].start = start, out[n].size = p->mem_slices;
    return n;
}

API nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t device, unsigned int profileId,
                                                               nvmlGpuInstancePlacement_t *placements,
                                                               unsigned int *count) {
    nvmlReturn_t rc = enter_mig_capable(device);
    const struct mig_profile *p = gi_profile(profileId);
    if (!rc && (!count || profileId >= NVML_GPU_INSTANCE_PROFILE_COUNT)) rc = NVML_ERROR_INVALID_ARGUMENT;
    if (!rc && !p) rc = NVML_ERROR_NOT_SUPPORTED;
    if (!rc) *count = gi_placements(p, placements, MIG_MEMORY_SLICES);
    return leave(rc);
}

/* The name go-nvml falls back to where the library has no _v2 (NVML before 11.4): the same answer. */
API nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements(nvmlDevice_t device, unsigned int profileId,
                                                            nvmlGpuInstancePlacement_t *placements, unsigned int *count) {
    return nvmlDeviceGetGpuInstancePossiblePlacements_v2(device, profileId, placements, count);
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id, nvmlGpuInstance_t *gpuInstance) {
    nvmlReturn_t rc = enter_mig_capable(device);
    if (!rc && !gpuInstance) rc = NVML_ERROR_INVALID_ARGUMENT;
    if (!rc && !device->gpu.mig_enabled) rc = NVML_ERROR_NOT_SUPPORTED;
    if (!rc) {
        rc = NVML_ERROR_NOT_FOUND;
        for (size_t j = 0; rc && j < device->gpu.nmigs; j++)
            if (device->migs[j]->mig.gi == id) *gpuInstance = &device->migs[j]->gi, rc = NVML_SUCCESS;
    }
    return leave(rc);
}

/* Lock and check a GPU or compute instance (given: not NULL): the MIG device it belongs to, or NULL with the
 * answer in *rc. */
static nvmlDevice_t enter_instance(int given, unsigned magic, nvmlDevice_t mig, nvmlReturn_t *rc) {
    pthread_mutex_lock(&mu);
    *rc = !initialized ? NVML_ERROR_UNINITIALIZED
          : !given || magic != INSTANCE_MAGIC || !valid_device(mig) || !mig->parent ? NVML_ERROR_INVALID_ARGUMENT
          : mig->parent->gpu.lost ? NVML_ERROR_GPU_IS_LOST
          : NVML_SUCCESS;
    return *rc ? NULL : mig;
}

static nvmlDevice_t enter_gi(nvmlGpuInstance_t gi, nvmlReturn_t *rc) {
    return enter_instance(gi != NULL, gi ? gi->magic : 0, gi ? gi->mig : NULL, rc);
}

static nvmlDevice_t enter_ci(nvmlComputeInstance_t ci, nvmlReturn_t *rc) {
    return enter_instance(ci != NULL, ci ? ci->magic : 0, ci ? ci->mig : NULL, rc);
}

API nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance, nvmlGpuInstanceInfo_t *info) {
    nvmlReturn_t rc;
    nvmlDevice_t m = enter_gi(gpuInstance, &rc);
    if (!rc && !info) rc = NVML_ERROR_INVALID_ARGUMENT;
    if (!rc) {
        /* the MIG devices lie in list order, each at the first placement after the one before (a multiple of its
         * size: gi_placements) */
        unsigned start = 0, size = m->mig.profile->mem_slices;
        for (unsigned j = 0; j < m->index; j++) {
            unsigned s = m->parent->migs[j]->mig.profile->mem_slices;
            start = (start + s - 1) / s * s + s;
        }
        start = (start + size - 1) / size * size;
        memset(info, 0, sizeof *info);
        info->device = m->parent, info->id = m->mig.gi, info->profileId = m->mig.profile->gi_profile;
        info->placement.start = start, info->placement.size = m->mig.profile->mem_slices;
    }
    return leave(rc);
}

API nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(nvmlGpuInstance_t gpuInstance, unsigned int profile,
                                                               unsigned int engProfile,
                                                               nvmlComputeInstanceProfileInfo_t *info) {
    static const unsigned slices_of[] = {1, 2, 3, 4, 7}; /* NVML_COMPUTE_INSTANCE_PROFILE_<n>_SLICE, by ID */
    nvmlReturn_t rc;
    nvmlDevice_t m = enter_gi(gpuInstance, &rc);
    if (!rc && (!info || profile >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT ||
                engProfile != NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED))
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (!rc && (profile >= sizeof slices_of / sizeof slices_of[0] || slices_of[profile] > m->mig.profile->slices))
        rc = NVML_ERROR_NOT_SUPPORTED;
    if (!rc) {
        unsigned n = slices_of[profile];
        memset(info, 0, sizeof *info);
        info->id = profile, info->sliceCount = n, info->instanceCount = m->mig.profile->slices / n;
        info->multiprocessorCount = m->parent->gpu.model->sms_per_slice * n;
        info->sharedCopyEngineCount = m->mig.profile->slices, info->sharedDecoderCount = (m->mig.profile->slices + 1) / 2;
    }
    return leave(rc);
}

API nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t gpuInstance, unsigned int id,
                                                       nvmlComputeInstance_t *computeInstance) {
    nvmlReturn_t rc;
    nvmlDevice_t m = enter_gi(gpuInstance, &rc);
    if (!rc && !computeInstance) rc = NVML_ERROR_INVALID_ARGUMENT;
    if (!rc && id != 0) rc = NVML_ERROR_NOT_FOUND;
    if (!rc) *computeInstance = &m->ci;
    return leave(rc);
}

API nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t computeInstance, nvmlComputeInstanceInfo_t *info) {
    nvmlReturn_t rc;
    nvmlDevice_t m = enter_ci(computeInstance, &rc);
    if (!rc && !info) rc = NVML_ERROR_INVALID_ARGUMENT;
    if (!rc) {
        memset(info, 0, sizeof *info);
        info->device = m->parent, info->gpuInstance = &m->gi, info->id = 0;
        info->profileId = (unsigned)ci_profile_id(m->mig.profile->slices);
        info->placement.start = 0, info->placement.size = m->mig.profile->slices;
    }
    return leave(rc);
}

/* ---- ECC: always enabled; uncorrected errors as "events" lists them ------------------------------------ */
API nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, int *current, int *pending) {
    nvmlReturn_t rc = enter_gpu(device);
    if (!rc && (!current || !pending)) rc = NVML_ERROR_INVALID_ARGUMENT;
    if (!rc) *current = *pending = NVML_FEATURE_ENABLED;
    return leave(rc);
}

/* A GPU's count of errorType (volatile and aggregate alike); INVALID_ARGUMENT for types NVML does not define. */
static nvmlReturn_t ecc_count(nvmlDevice_t device, int errorType, int counterType, unsigned long long *count) {
    nvmlReturn_t rc = enter_gpu(device);
    int known_error = errorType == NVML_MEMORY_ERROR_TYPE_CORRECTED || errorType == NVML_MEMORY_ERROR_TYPE_UNCORRECTED;
    int known_counter = counterType == NVML_VOLATILE_ECC || counterType == NVML_AGGREGATE_ECC;
    if (!rc && (!count || !known_error || !known_counter)) rc = NVML_ERROR_INVALID_ARGUMENT;
    if (!rc) *count = errorType == NVML_MEMORY_ERROR_TYPE_UNCORRECTED ? device->gpu.ecc_uncorrected : 0;
    return rc;
}

API nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int errorType, int counterType,
                                             unsigned long long *eccCounts) {
    return leave(ecc_count(device, errorType, counterType, eccCounts));
}

/* The errors lie in device memory (DRAM); the other locations count none. */
API nvmlReturn_t nvmlDeviceGetMemoryErrorCounter(nvmlDevice_t device, int errorType, int counterType, int locationType,
                                                 unsigned long long *count) {
    nvmlReturn_t rc = ecc_count(device, errorType, counterType, count);
    if (!rc && (locationType < 0 || locationType >= NVML_MEMORY_LOCATION_COUNT)) rc = NVML_ERROR_INVALID_ARGUMENT;
    if (!rc && locationType != NVML_MEMORY_LOCATION_DEVICE_MEMORY) *count = 0;
    return leave(rc);
}

/* ---- events -------------------------------------------------------------------------------------------- */
API nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *types) {
    nvmlReturn_t rc = enter_gpu(device);
    if (!rc && !types) rc = NVML_ERROR_INVALID_ARGUMENT;
    if (!rc) *types = MOCK_EVENT_TYPES;
    return leave(rc);
}

static int set_known(nvmlEventSet_t set) {
    for (nvmlEventSet_t s = sets; s; s = s->next)
        if (s == set) return 1;
    return 0;
}

API nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&mu);
    nvmlReturn_t rc = initialized ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    nvmlEventSet_t s = rc ? NULL : calloc(1, sizeof *s);
    if (!rc && !s) rc = NVML_ERROR_UNKNOWN;
    if (!rc) {
        s->cursor = init_log_start, s->next = sets, sets = s;
        *set = s;
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

API nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    pthread_mutex_lock(&mu);
    nvmlReturn_t rc = NVML_ERROR_INVALID_ARGUMENT;
    for (nvmlEventSet_t *link = &sets; *link; link = &(*link)->next) {
        if (*link == set) {
            *link = set->next;
            free(set->regs);
            free(set);
            rc = NVML_SUCCESS;
            pthread_cond_broadcast(&changed); /* a waiter on it returns INVALID_ARGUMENT */
            break;
        }
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

API nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types, nvmlEventSet_t set) {
    nvmlReturn_t rc = enter_gpu(device);
    if (!rc && !set_known(set)) rc = NVML_ERROR_INVALID_ARGUMENT;
    if (!rc && (types & ~(unsigned long long)MOCK_EVENT_TYPES)) rc = NVML_ERROR_NOT_SUPPORTED;
    if (!rc) {
        struct registration *r = NULL;
        for (size_t i = 0; i < set->nregs && !r; i++)
            if (set->regs[i].device == device) r = &set->regs[i];
        if (!r && set->nregs == set->cap) {
            size_t ncap = set->cap ? set->cap * 2 : 8;
            struct registration *grown = realloc(set->regs, ncap * sizeof *grown);
            if (!grown) return leave(NVML_ERROR_UNKNOWN);
            set->regs = grown, set->cap = ncap;
        }
        if (!r) {
            r = &set->regs[set->nregs++];
            r->device = device, r->types = 0, r->lost_epoch_seen = device->lost_epoch;
        }
        r->types |= types;
    }
    return leave(rc);
}

static struct registration *registration(nvmlEventSet_t set, nvmlDevice_t device) {
    for (size_t i = 0; i < set->nregs; i++)
        if (set->regs[i].device == device) return &set->regs[i];
    return NULL;
}

/* Next logged event of a type this set registered its device for (mu held); skips the others. */
static int take_event(nvmlEventSet_t set, nvmlEventData_t *data) {
    while (set->cursor < nlog) {
        const struct logged_event *e = &event_log[set->cursor++];
        const struct registration *r = registration(set, e->device);
        if (r && (r->types & e->type)) {
            data->device = e->device, data->eventType = e->type, data->eventData = e->data;
            data->gpuInstanceId = data->computeInstanceId = 0xFFFFFFFFU;
            return 1;
        }
    }
    return 0;
}

/* A registered GPU that became lost since this set last looked (mu held), reported once. */
static int take_lost(nvmlEventSet_t set) {
    for (size_t i = 0; i < set->nregs; i++) {
        struct registration *r = &set->regs[i];
        if (r->lost_epoch_seen != r->device->lost_epoch) {
            r->lost_epoch_seen = r->device->lost_epoch;
            if (r->device->present && r->device->gpu.lost) return 1;
        }
    }
    return 0;
}

API nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    struct timespec deadline;
    nvmlReturn_t rc;
    if (!data) return NVML_ERROR_INVALID_ARGUMENT;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += timeoutms / 1000;
    deadline.tv_nsec += (long)(timeoutms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) deadline.tv_sec++, deadline.tv_nsec -= 1000000000L;
    pthread_mutex_lock(&mu);
    for (;;) {
        if (!initialized) rc = NVML_ERROR_UNINITIALIZED;
        else if (!set_known(set)) rc = NVML_ERROR_INVALID_ARGUMENT;
        else if (take_event(set, data)) rc = NVML_SUCCESS;
        else if (take_lost(set)) rc = NVML_ERROR_GPU_IS_LOST;
        else if (pthread_cond_timedwait(&changed, &mu, &deadline) == ETIMEDOUT) rc = NVML_ERROR_TIMEOUT;
        else continue;
        break;
    }
    pthread_mutex_unlock(&mu);
    return rc;
}
