package quma

import (
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"
)

// timeFunctions read the clock: a result that calls them is not reproducible
// from a snapshot. The rewrite is to pass the time as a parameter.
var timeFunctions = map[string]bool{
	"now": true, "statement_timestamp": true, "transaction_timestamp": true,
	"clock_timestamp": true, "timeofday": true,
}

// volatileFunctions change state or return a different value per call.
var volatileFunctions = map[string]bool{
	"random": true, "random_normal": true, "setseed": true,
	"nextval": true, "currval": true, "lastval": true, "setval": true,
	"gen_random_uuid": true, "uuid_generate_v1": true, "uuid_generate_v1mc": true, "uuid_generate_v4": true,
	"pg_sleep": true, "pg_sleep_for": true, "pg_sleep_until": true,
	"txid_current": true, "txid_current_if_assigned": true, "pg_current_xact_id": true, "pg_current_xact_id_if_assigned": true,
	"pg_current_wal_lsn": true, "pg_current_wal_insert_lsn": true, "pg_current_snapshot": true, "txid_current_snapshot": true,
	"set_config": true, "current_setting": true, "pg_notify": true,
	"pg_advisory_lock": true, "pg_advisory_xact_lock": true, "pg_try_advisory_lock": true, "pg_try_advisory_xact_lock": true,
	"pg_advisory_unlock": true, "pg_advisory_lock_shared": true,
	"dblink": true, "lo_import": true, "lo_export": true, "pg_read_file": true, "pg_stat_get_activity": true,
	"inet_client_addr": true, "inet_client_port": true, "pg_backend_pid": true, "pg_postmaster_start_time": true,
}

// safeFunctions are built-ins whose result depends only on their arguments
// (and on the role and search_path, which are part of every cache key), and
// that read no table: aggregates, window functions, string, math, JSON and
// array functions. A function in neither list is not cacheable unless the
// schema says it is immutable.
var safeFunctions = map[string]bool{}

func init() {
	for _, f := range strings.Fields(`
		count sum avg min max array_agg string_agg bool_and bool_or every bit_and bit_or
		json_agg jsonb_agg json_object_agg jsonb_object_agg stddev stddev_pop stddev_samp
		variance var_pop var_samp corr covar_pop covar_samp regr_slope regr_intercept
		percentile_cont percentile_disc mode
		row_number rank dense_rank percent_rank cume_dist ntile lag lead first_value last_value nth_value
		lower upper initcap length char_length character_length octet_length bit_length
		substr substring trim btrim ltrim rtrim lpad rpad left right repeat reverse replace
		split_part strpos position concat concat_ws format md5 sha224 sha256 sha384 sha512
		translate ascii chr quote_ident quote_literal quote_nullable starts_with
		regexp_replace regexp_match regexp_matches regexp_split_to_array regexp_split_to_table regexp_like
		abs ceil ceiling floor round trunc sign mod power pow sqrt cbrt exp ln log log10
		greatest least div gcd lcm width_bucket pi degrees radians sin cos tan asin acos atan atan2
		to_char to_number to_date to_timestamp date_part extract date_trunc make_date make_time
		make_timestamp make_timestamptz make_interval justify_days justify_hours justify_interval isfinite
		json_build_object jsonb_build_object json_build_array jsonb_build_array to_json to_jsonb
		row_to_json array_to_json json_object jsonb_object jsonb_set jsonb_insert jsonb_strip_nulls
		json_extract_path jsonb_extract_path json_extract_path_text jsonb_extract_path_text
		jsonb_array_length json_array_length jsonb_typeof json_typeof jsonb_pretty
		jsonb_array_elements json_array_elements jsonb_array_elements_text json_array_elements_text
		jsonb_each json_each jsonb_each_text json_each_text jsonb_object_keys json_object_keys jsonb_path_query
		array_length array_upper array_lower cardinality array_position array_positions array_remove
		array_replace array_append array_prepend array_cat array_to_string string_to_array array_dims unnest
		generate_series generate_subscripts
		coalesce nullif num_nonnulls num_nulls
		encode decode convert_from convert_to
		current_schema current_schemas current_user session_user current_role current_database
		`) {
		safeFunctions[f] = true
	}
}

// timeWords are string literals that PostgreSQL turns into the current time
// when cast to a date or time type ('now'::timestamp).
var timeWords = map[string]bool{"now": true, "today": true, "tomorrow": true, "yesterday": true}

const timeRewrite = "use now()/CURRENT_TIMESTAMP/CURRENT_DATE (cached per clock bucket), or pass the time as a parameter (rounded to a bucket, e.g. $now truncated to the minute)"

// checkCacheable walks the whole statement for what makes a result
// non-reproducible from a snapshot.
func (a *analysis) checkCacheable(n *pg.Node) {
	walk(n, func(m proto.Message) bool {
		switch x := m.(type) {
		case *pg.FuncCall:
			if isClockCall(a.schema, x) {
				a.clock = true // the transaction's start: clock-bound (clock.go)
				break
			}
			a.function(x.GetFuncname())
		case *pg.SQLValueFunction:
			if _, ok := clockValueTypes[x.GetOp()]; ok {
				a.clock = true
				break
			}
			switch x.GetOp() {
			case pg.SQLValueFunctionOp_SVFOP_CURRENT_TIME_N, pg.SQLValueFunctionOp_SVFOP_CURRENT_TIMESTAMP_N,
				pg.SQLValueFunctionOp_SVFOP_LOCALTIME_N, pg.SQLValueFunctionOp_SVFOP_LOCALTIMESTAMP_N:
				a.refuse("reads the clock with a precision (CURRENT_TIMESTAMP(p)/LOCALTIME(p)...)")
				a.rewrite = timeRewrite
			}
		case *pg.TypeCast:
			if c := x.GetArg().GetAConst(); c != nil && c.GetSval() != nil && timeWords[strings.ToLower(strings.TrimSpace(c.GetSval().GetSval()))] {
				a.refuse("reads the clock ('%s' cast to a time type)", c.GetSval().GetSval())
				a.rewrite = timeRewrite
			}
		case *pg.NextValueExpr:
			a.refuse("calls a sequence")
		}
		return true
	})
}

func (a *analysis) function(names []*pg.Node) {
	parts := make([]string, 0, len(names))
	for _, n := range names {
		parts = append(parts, strings.ToLower(n.GetString_().GetSval()))
	}
	if len(parts) == 0 {
		return
	}
	name := parts[len(parts)-1]
	qualified := strings.Join(parts, ".")
	builtin := len(parts) == 1 || parts[0] == "pg_catalog"
	if v, ok := a.schema.Functions[qualified]; ok || (len(parts) == 1 && a.userFunction(name, &v)) {
		if v != Immutable {
			a.refuse("calls %s, which is not immutable (it may read tables or change)", qualified)
		}
		return
	}
	switch {
	case builtin && timeFunctions[name]:
		a.refuse("reads the clock (%s())", name)
		a.rewrite = timeRewrite
	case builtin && volatileFunctions[name]:
		a.refuse("calls volatile function %s()", name)
	case builtin && safeFunctions[name]:
	default:
		a.refuse("calls %s(), which is not known to be immutable (declare it IMMUTABLE in the schema, or analyze with --db)", qualified)
	}
}

// userFunction finds an unqualified user function through the search path.
func (a *analysis) userFunction(name string, v *Volatility) bool {
	path := a.schema.SearchPath
	if len(path) == 0 {
		path = []string{"public"}
	}
	for _, sp := range path {
		if got, ok := a.schema.Functions[sp+"."+name]; ok {
			*v = got
			return true
		}
	}
	return false
}
