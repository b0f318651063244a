"""Does a CUDA client know whether it is an MPS client? (CU_DEVICE_ATTRIBUTE_MPS_ENABLED)"""
import json, os, sys
out = {"env": {k: v for k, v in os.environ.items() if k.startswith("CUDA_MPS")}}
try:
    from cuda.bindings import driver as d
except Exception as e:  # older layout
    try:
        from cuda import cuda as d
    except Exception as e2:
        print("RESULT", json.dumps({"error": f"no cuda-python: {e} / {e2}"})); sys.exit(0)
def ok(r):
    err = r[0] if isinstance(r, tuple) else r
    return int(err) == 0, (r[1] if isinstance(r, tuple) and len(r) > 1 else None)
out["init"] = str(d.cuInit(0)[0])
good, dev = ok(d.cuDeviceGet(0))
names = [n for n in dir(d.CUdevice_attribute) if "MPS" in n]
out["attr_names"] = names
for n in names:
    r = d.cuDeviceGetAttribute(getattr(d.CUdevice_attribute, n), dev)
    out[n] = [str(r[0]), int(r[1]) if len(r) > 1 else None]
# A context, then free/total as the client sees them.
r = d.cuCtxCreate(None, 0, dev) if hasattr(d, "cuCtxCreate") else None
try:
    ctx = d.cuDevicePrimaryCtxRetain(dev)
    d.cuCtxSetCurrent(ctx[1])
    mi = d.cuMemGetInfo()
    out["mem_get_info_gib"] = [round(int(mi[1]) / 2**30, 3), round(int(mi[2]) / 2**30, 3)]
    for n in names:
        r = d.cuDeviceGetAttribute(getattr(d.CUdevice_attribute, n), dev)
        out[n + "_after_ctx"] = [str(r[0]), int(r[1]) if len(r) > 1 else None]
except Exception as e:
    out["ctx_error"] = repr(e)
print("RESULT", json.dumps(out))
