# Real servers for the test suite, on loopback: sourced by .ci/run.
#
# start_services installs what is missing (Redis and Prometheus from Debian's packages; the
# PostgreSQL binaries come with the machine image), starts a throwaway PostgreSQL cluster, a Redis
# server and a Prometheus server on free loopback ports in a temporary directory, and exports
# AIQSIM_TEST_POSTGRES_DSN and AIQSIM_TEST_REDIS_URL for tests/conftest.py, and
# AIQSIM_TEST_PROMETHEUS_URL with AIQSIM_TEST_PROMETHEUS_TARGETS (a folder of file_sd target files
# Prometheus re-reads every second; scraped every second) for tests/test_observability_prometheus.py.
# stop_services (run on exit) stops them all and removes their files. Under CI=true a server that cannot be started fails the run: the tests
# that need it would otherwise be skipped and prove nothing.

SERVICES_DIR=""
PG_PREFIX=()

_free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

_find_pg_bin() {
    local dir
    for dir in /usr/lib/postgresql/17/bin /usr/lib/postgresql/16/bin /usr/lib/postgresql/15/bin; do
        if [ -x "$dir/pg_ctl" ]; then echo "$dir"; return 0; fi
    done
    if command -v pg_ctl >/dev/null 2>&1; then dirname "$(command -v pg_ctl)"; return 0; fi
    return 1
}

_service_missing() {
    if [ "${CI:-}" = "true" ]; then
        echo "services: $1 (CI=true: failing instead of skipping the tests that need it)" >&2
        exit 1
    fi
    echo "services: $1; the tests that need it will be skipped" >&2
}

start_services() {
    SERVICES_DIR=$(mktemp -d "${TMPDIR:-/tmp}/aiqsim-services.XXXXXX")
    chmod 755 "$SERVICES_DIR"

    if ! command -v redis-server >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "services: installing redis-server from Debian's packages" >&2
        apt-get update -qq >/dev/null 2>&1 || true
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null 2>&1 || true
    fi
    if command -v redis-server >/dev/null 2>&1; then
        local redis_port
        redis_port=$(_free_port)
        mkdir -p "$SERVICES_DIR/redis"
        redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
            --dir "$SERVICES_DIR/redis" --daemonize yes --pidfile "$SERVICES_DIR/redis/redis.pid" \
            --logfile "$SERVICES_DIR/redis/redis.log"
        for _ in $(seq 100); do
            redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break
            sleep 0.1
        done
        if redis-cli -p "$redis_port" ping >/dev/null 2>&1; then
            export AIQSIM_TEST_REDIS_URL="redis://127.0.0.1:$redis_port/0"
            echo "services: Redis on $AIQSIM_TEST_REDIS_URL" >&2
        else
            _service_missing "Redis did not start ($(tail -3 "$SERVICES_DIR/redis/redis.log" 2>/dev/null))"
        fi
    else
        _service_missing "redis-server is not installed"
    fi

    _start_prometheus

    local pg_bin
    if pg_bin=$(_find_pg_bin); then
        local pg_port data="$SERVICES_DIR/pg/data" sock="$SERVICES_DIR/pg/sock"
        pg_port=$(_free_port)
        mkdir -p "$sock"
        if [ "$(id -u)" = 0 ]; then  # PostgreSQL refuses to run as root
            chown -R postgres "$SERVICES_DIR/pg"
            PG_PREFIX=(runuser -u postgres --)
        fi
        # fsync=off: the tests kill processes, never the machine, and the page cache survives a
        # killed process; a flush per commit only made the PostgreSQL tests slow (Redis above keeps
        # nothing on disk at all).
        if "${PG_PREFIX[@]}" "$pg_bin/initdb" -D "$data" -A trust -U postgres -E UTF8 --no-sync >/dev/null \
            && "${PG_PREFIX[@]}" "$pg_bin/pg_ctl" -D "$data" -l "$SERVICES_DIR/pg/server.log" -w -t 60 \
                -o "-p $pg_port -k $sock -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=off" \
                start >/dev/null \
            && "${PG_PREFIX[@]}" "$pg_bin/createdb" -h 127.0.0.1 -p "$pg_port" -U postgres aiqsim; then
            export AIQSIM_TEST_POSTGRES_DSN="postgresql://postgres@127.0.0.1:$pg_port/aiqsim"
            echo "services: PostgreSQL on $AIQSIM_TEST_POSTGRES_DSN" >&2
        else
            _service_missing "PostgreSQL did not start ($(tail -3 "$SERVICES_DIR/pg/server.log" 2>/dev/null))"
        fi
    else
        _service_missing "PostgreSQL's pg_ctl is not installed"
    fi
}

# Prometheus, the distribution's package: one scrape job whose targets are the JSON files a test
# drops into $SERVICES_DIR/prometheus/targets (tests/prometheus_server.py writes the same config
# for a throwaway server). Each test labels its target with an id of its own, so tests running in
# parallel share this server without reading each other's series.
_prometheus_ready() {
    python3 -c "import sys, urllib.request as u
try: u.build_opener(u.ProxyHandler({})).open('http://127.0.0.1:$1/-/ready', timeout=2)
except OSError: sys.exit(1)" >/dev/null 2>&1
}

_start_prometheus() {
    if ! command -v prometheus >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "services: installing prometheus from Debian's packages" >&2
        apt-get update -qq >/dev/null 2>&1 || true
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus \
            >/dev/null 2>&1 || true
    fi
    if ! command -v prometheus >/dev/null 2>&1; then
        _service_missing "prometheus is not installed"
        return 0
    fi
    local dir="$SERVICES_DIR/prometheus" prom_port
    prom_port=$(_free_port)
    mkdir -p "$dir/targets" "$dir/data"
    cat >"$dir/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: aiqsim-tests
    file_sd_configs:
      - files: ["$dir/targets/*.json"]
        refresh_interval: 1s
YAML
    prometheus --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/data" \
        --web.listen-address="127.0.0.1:$prom_port" >"$dir/prometheus.log" 2>&1 &
    echo $! >"$dir/prometheus.pid"
    for _ in $(seq 300); do  # at most a minute
        _prometheus_ready "$prom_port" && break
        kill -0 "$(cat "$dir/prometheus.pid")" 2>/dev/null || break
        sleep 0.2
    done
    if _prometheus_ready "$prom_port"; then
        export AIQSIM_TEST_PROMETHEUS_URL="http://127.0.0.1:$prom_port"
        export AIQSIM_TEST_PROMETHEUS_TARGETS="$dir/targets"
        echo "services: Prometheus on $AIQSIM_TEST_PROMETHEUS_URL (targets in $AIQSIM_TEST_PROMETHEUS_TARGETS)" >&2
    else
        _service_missing "Prometheus did not start ($(tail -3 "$dir/prometheus.log" 2>/dev/null))"
    fi
}

stop_services() {
    [ -n "$SERVICES_DIR" ] || return 0
    if [ -f "$SERVICES_DIR/prometheus/prometheus.pid" ]; then
        kill "$(cat "$SERVICES_DIR/prometheus/prometheus.pid")" 2>/dev/null || true
        wait "$(cat "$SERVICES_DIR/prometheus/prometheus.pid")" 2>/dev/null || true
    fi
    if [ -f "$SERVICES_DIR/redis/redis.pid" ]; then
        kill "$(cat "$SERVICES_DIR/redis/redis.pid")" 2>/dev/null || true
    fi
    if [ -d "$SERVICES_DIR/pg/data" ]; then
        local pg_bin
        pg_bin=$(_find_pg_bin) && "${PG_PREFIX[@]}" "$pg_bin/pg_ctl" -D "$SERVICES_DIR/pg/data" -m immediate \
            -w stop >/dev/null 2>&1 || true
    fi
    rm -rf "$SERVICES_DIR"
}
