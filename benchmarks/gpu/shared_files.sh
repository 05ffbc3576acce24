# Sourced by the scripts that fill the carry folder (prepare.sh, build_sglang_archive.sh), which set $root.
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
