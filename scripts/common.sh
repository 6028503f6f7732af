# Shared by the scripts: build settings and ccache, sourced not run.
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
jobs=${KVCACHE_JOBS:-$(nproc)}
# ccache keyed on paths relative to the clone, so a fresh clone elsewhere reuses the cache.
export CCACHE_BASEDIR="$repo_root"
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
export CCACHE_NOHASHDIR=1
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-5G}"

# configure_build <dir> [cmake args...]
configure_build() {
    local dir=$1
    shift
    cmake -S "$repo_root" -B "$repo_root/$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
}
