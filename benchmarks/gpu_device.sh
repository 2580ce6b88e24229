#!/usr/bin/env bash
# The GPU check on a lent machine that reaches no package index, from what benchmarks/gpu_prepare.py made here.
# Runs on the same machine, each carrying one part beside the tree (each fits a 64 MiB transfer):
#   benchmarks/gpu_device.sh stash          carrying .gpu/a: keeps onnxruntime-gpu's libraries in /tmp/gpu
#   benchmarks/gpu_device.sh run [SECONDS]  carrying .gpu/b: installs, checks, times; report in $OUT as it goes
#   benchmarks/gpu_device.sh profile        carrying .gpu/b: one step's time at several sizes, and its kernels
#   benchmarks/gpu_device.sh anatomy [SECONDS] carrying .gpu/b and .whl: where a step's time goes for every engine
#                                           and size (benchmarks/step_anatomy.py, kernels by the torch profiler,
#                                           more flags in ANATOMY_FLAGS), then the server under load for what is left
#                                           of SECONDS (default 150; PARTS: other gpu_check parts); .whl: wheels of
#                                           what the machine lacks
#                                           (opentelemetry-api, which the server imports)
# The tree travels without the checkpoints (the device needs only the fp16 export in .gpu/b): empty them here
# for the runs and restore them after (git checkout model/). With network access, `make gpu-check` instead.
set -u
here=/tmp/gpu
out=${OUT:-/tmp/gpu-out}
mkdir -p "$here" "$out"

install() {  # onnxruntime-gpu from the stashed part and .gpu/b, into /tmp/site
    python3 - <<'PY' || return 1
import lzma, pathlib, tarfile
site = pathlib.Path("/tmp/site")
with tarfile.open(".gpu/b/onnxruntime.tar.xz") as tar:
    tar.extractall(site)
capi = site / "onnxruntime" / "capi"
stash = pathlib.Path("/tmp/gpu")
(capi / "libonnxruntime_providers_cuda.so").write_bytes(lzma.decompress((stash / "libonnxruntime_providers_cuda.so.xz").read_bytes()))
(capi / (stash / "extension_name").read_text()).write_bytes(lzma.decompress((stash / "onnxruntime_pybind11_state.so.xz").read_bytes()))
PY
    # Python packages the machine lacks (the server's opentelemetry-api), carried as wheels in .whl when asked
    if [ -d .whl ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || return 1
    fi
    cp .gpu/b/proto/*.py proto/
    # the gRPC modules were generated for a newer grpcio than the machine's: their stubs run on it, so say so
    sed -i "s/^GRPC_GENERATED_VERSION = .*/GRPC_GENERATED_VERSION = '$(python3 -c 'import grpc; print(grpc.__version__)')'/" proto/translate_pb2_grpc.py
    # onnxruntime-gpu's CUDA libraries: those of the CUDA packages beside the machine's own PyTorch
    nvidia=$(python3 -c "import glob, os, site; print(':'.join(sorted({os.path.dirname(p) for s in site.getsitepackages() for p in glob.glob(s + '/nvidia/**/lib*.so*', recursive=True)})))")
    export LD_LIBRARY_PATH=$nvidia${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
    python3 -c "import onnxruntime as o; print(o.__version__, o.__file__, o.get_available_providers())"
}

case "${1:-}" in
stash)
    cp .gpu/a/* "$here"/ && ls -la "$here"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    ;;
run)
    install || exit 1
    budget=${2:-360}
    timeout $((budget + 60)) python3 benchmarks/gpu_check.py --model .gpu/b/model --variants fp16 \
        --reference .gpu/b/reference.json --data .gpu/b/data --beam-search-op .gpu/b/beam_search.fp16.onnx \
        --parts "${PARTS:-buckets,agreement,load}" --speed-sentences "${SPEED_SENTENCES:-1000}" \
        --budget "$budget" --load-seconds 10 --clients 16 \
        --report "$out/gpu_check.md" 2>&1 | tee "$out/log.txt"
    ;;
profile)
    install || exit 1
    step="python3 benchmarks/gpu_step_profile.py --model .gpu/b/model"
    for args in "--rows 1" "--rows 1 --graphs" "--rows 1 --graphs --steps-per-run 8" "--rows 1 --fusions" \
        "--rows 32" "--rows 32 --graphs" "--rows 128" "--rows 128 --graphs" "--rows 128 --graphs --fusions" \
        "--rows 1 --beam 4" "--rows 32 --beam 4" "--rows 32 --beam 4 --graphs"; do
        timeout 60 $step $args 2>/dev/null | tee -a "$out/step_times.txt"
    done
    for args in "--rows 1" "--rows 128" "--rows 32 --beam 4"; do  # each kernel of a step, launched on its own
        name=$(echo "$args" | tr -d ' -')
        timeout 120 ncu --print-summary per-kernel --launch-skip 600 --launch-count 300 $step $args \
            --warmup 10 --steps 10 > "$out/kernels_$name.txt" 2>&1
        tail -40 "$out/kernels_$name.txt"
    done
    ;;
anatomy)
    set -o pipefail
    install || exit 1
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
    anatomy="python3 benchmarks/step_anatomy.py --model .gpu/b/model --json $out/anatomy.json ${ANATOMY_FLAGS:-}"
    # the kernels are counted by torch's profiler in the same process; without them if that fails here
    timeout 240 $anatomy --kernels 2>&1 | tee "$out/anatomy.md" || timeout 180 $anatomy 2>&1 | tee "$out/anatomy.md"
    budget=${2:-150}
    timeout $((budget + 60)) python3 benchmarks/gpu_check.py --model .gpu/b/model --variants fp16 \
        --reference .gpu/b/reference.json --data .gpu/b/data --parts "${PARTS:-load}" --speed-sentences 500 \
        --budget "$budget" --load-seconds 10 --clients 16 --report "$out/gpu_check.md" 2>&1 | tee "$out/log.txt"
    ;;
*)
    echo "usage: $0 stash | run [SECONDS] | profile | anatomy [SECONDS]" >&2
    exit 2
    ;;
esac
