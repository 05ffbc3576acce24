# Sourced by the scripts that run slime's own tests in a temporary copy outside this repository (slime's code
# is not ours to commit), whose arguments are SLIME_GIT_DIR [PYTHON] [pytest args...].
# slime_work "$0" "$@": sets slime (the clone, or bare mirror, of THUDM/slime), python (default python), rest
# (the pytest arguments) and work (an empty folder, removed when the script exits).
slime_work() {
  local script=$1
  shift
  slime=${1:?usage: $script SLIME_GIT_DIR [PYTHON] [pytest args...]}
  python=${2:-python}
  shift $(( $# >= 2 ? 2 : 1 ))
  rest=("$@")
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
}
