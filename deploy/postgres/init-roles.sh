#!/bin/sh
# Least privilege for docker-compose.yml: run once by the postgres image when its data volume is
# first created (/docker-entrypoint-initdb.d), as the superuser, which nothing of ours uses again.
#
# Each process of ours has its own DSN secret; this script makes the login role each one names:
#   database_url_owner        owns the database: `migrate --roles` and the `tasks …` commands
#   database_url_api          a member of mcp_tasks_api          (serve)
#   database_url_worker       a member of mcp_tasks_worker       (the tool workers)
#   database_url_maintenance  a member of mcp_tasks_maintenance  (GC and the sweeper)
# The group roles get their table privileges from `migrate --roles` (mcp_celery_tasks/store/roles.py).
#
# A deployment whose volume predates this script runs it by hand once, as the superuser:
#   docker compose exec postgres sh /docker-entrypoint-initdb.d/10-mcp-roles.sh
# MCP_DB_SECRETS (default /run/secrets) and POSTGRES_DB (default mcp_tasks) say where to look.
set -eu
secrets=${MCP_DB_SECRETS:-/run/secrets}
db=${POSTGRES_DB:-mcp_tasks}

# postgresql://user:password@host:port/db -> "user password"; the passwords secrets/README.md
# generates are hex, so nothing in them is percent-encoded.
login_of() {
  url=$(cat "$secrets/$1")
  case "$url" in
    *%*) echo "init-roles: $1 holds a percent-encoded character; use a hex password" >&2; exit 1 ;;
  esac
  user=$(printf '%s' "$url" | sed -n -E 's#^postgres(ql)?://([^:@/]+):([^@/]+)@.*#\2#p')
  password=$(printf '%s' "$url" | sed -n -E 's#^postgres(ql)?://([^:@/]+):([^@/]+)@.*#\3#p')
  [ -n "$user" ] && [ -n "$password" ] || { echo "init-roles: $1 names no user and password" >&2; exit 1; }
  printf '%s %s' "$user" "$password"
}

# One assignment each: `set -e` stops the script when one of them fails.
owner=$(login_of database_url_owner)
api=$(login_of database_url_api)
worker=$(login_of database_url_worker)
maint=$(login_of database_url_maintenance)
# shellcheck disable=SC2086 # split "user password" pairs on purpose
set -- $owner $api $worker $maint

psql -v ON_ERROR_STOP=1 --no-psqlrc --dbname "$db" \
  -v db="$db" -v owner="$1" -v owner_pw="$2" -v api="$3" -v api_pw="$4" \
  -v worker="$5" -v worker_pw="$6" -v maint="$7" -v maint_pw="$8" <<'SQL'
-- The group roles are cluster-wide and may exist already (another database of the cluster).
SELECT format('CREATE ROLE %I NOLOGIN', name) FROM unnest(ARRAY['mcp_tasks_api', 'mcp_tasks_worker',
  'mcp_tasks_maintenance', 'mcp_tasks_admin', 'mcp_tasks_autoscaler']) AS name
 WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = name) \gexec

CREATE ROLE :"owner" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD :'owner_pw';
ALTER DATABASE :"db" OWNER TO :"owner";
ALTER SCHEMA public OWNER TO :"owner";
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
CREATE ROLE :"api" LOGIN PASSWORD :'api_pw' IN ROLE mcp_tasks_api;
CREATE ROLE :"worker" LOGIN PASSWORD :'worker_pw' IN ROLE mcp_tasks_worker;
CREATE ROLE :"maint" LOGIN PASSWORD :'maint_pw' IN ROLE mcp_tasks_maintenance;
SQL
echo "init-roles: $1 owns $db; $3, $5 and $7 log in as the api, the workers and maintenance"
