# Sourced by the scripts that fill the carry folder (prepare.sh, build_sglang_archive.sh,
# build_vllm_archive.sh), which set $root.
# shared_file NAME: the path of NAME in the shared GPU files (shared/gpu/ in this checkout or beside it);
# empty when neither has it.
shared_file() {
  local candidate
  for candidate in "$root/shared/gpu/$1" "$root/../shared/gpu/$1"; do
    if [ -e "$candidate" ]; then
      echo "$candidate"
      return
    fi
  done
}

# gpu_wheels DEST SPEC...: the wheels of SPEC (name==version) for the GPU image's CPython 3.12 on x86-64
# Linux (any manylinux it runs), without their dependencies, downloaded into DEST.
gpu_wheels() {
  local dest=$1 n
  shift
  local platforms=()
  for n in 39 38 37 36 35 34 33 32 31 30 29 28 27 26 25 24 17; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
  platforms+=(--platform manylinux2014_x86_64 --platform linux_x86_64 --platform any)
  PIP_CONFIG_FILE=/dev/null python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp --abi cp312 --abi abi3 --abi none "${platforms[@]}" -d "$dest" "$@"
}

# tar_pieces DIR OUT PIECE_SIZE [FILE...]: FILE... of DIR (default: its wheels) in one uncompressed tar, cut
# into pieces of PIECE_SIZE named OUT.part-NN (those of an earlier build removed first), then listed.
tar_pieces() {
  local dir=$1 out=$2 piece=$3
  shift 3
  rm -f "$out".part-*
  (cd "$dir" && if [ $# -eq 0 ]; then set -- ./*.whl; fi && tar cf - "$@") | split -b "$piece" -d -a 2 - "$out.part-"
  ls -l "$out".part-*
}
