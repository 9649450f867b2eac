package redisstore

import (
	"strings"

	"github.com/redis/go-redis/v9"
)

// The scripts run atomically on the server. Every one receives the key
// prefix (with its trailing colon) as ARGV[1] and builds the names of the
// keys it meets in the indexes from it, so the store needs one Redis, not a
// cluster (see doc.go).
//
// Timestamps travel and are stored as 8-byte big-endian strings: Lua 5.1
// numbers are doubles and cannot hold a uint64, and Lua compares strings
// with strcoll, which depends on the server's locale. lt compares two of
// them as pairs of exact 32-bit halves.
//
// Only put is denied when Redis is out of memory (its shebang has no
// flags); every other script may run then (allow-oom), because ending
// versions and cleaning the indexes must never fail for lack of memory.
//
// Each Store runs its own copy of the scripts (newScripts puts a random
// token in their source, so their SHA1s are its own) and never loads them
// behind the node's back: a NOSCRIPT answer means the server lost its
// script cache — it restarted, or a replica took over — and may have lost
// writes with it (store.ErrLost).
//
// Versions are indexed (in the sets of their tags and tables, or in
// P:nodeps) until they are settled: open, or closed but still possibly
// shortened by an older invalidation delivered late. P:closed lists the
// indexed closed ones, which settle visits.

// lib is the code every script shares.
const lib = `
local P = ARGV[1]
local LEGACY = false -- store.OrderDependentForTest: a closed version is final
local OPEN = string.rep('\255', 8)
local PENDING, SETTLED = 1, 2
local COMPULSORY, STALENESS, CAPACITY, CONSISTENCY = 1, 2, 3, 4

local function lt(a, b)
  local ah, al = struct.unpack('>I4I4', a)
  local bh, bl = struct.unpack('>I4I4', b)
  return ah < bh or (ah == bh and al < bl)
end

local function dkey(k) return P .. 'd:' .. k end
local function vkey(m) return P .. 'v:' .. m end

-- An entry is lo(8) hi(8) flags(1) size(4) deps...; a dep is
-- allColumns(1) tag(2+n) table(2+n) nreads(2) reads(2+n each). size is
-- store.Version.Size, what the store counts in P..'n' bytes.
local function sizeOf(e) return (struct.unpack('>I4', e, 18)) end
local function hiOf(e) return string.sub(e, 9, 16) end
local function withHi(e, hi) return string.sub(e, 1, 8) .. hi .. string.sub(e, 17) end
local function hasFlag(e, f) return math.floor(string.byte(e, 17) / f) % 2 == 1 end
local function isSettled(e) return hasFlag(e, SETTLED) end
local function settledEntry(e)
  if isSettled(e) then return e end
  return string.sub(e, 1, 16) .. string.char(string.byte(e, 17) + SETTLED) .. string.sub(e, 18)
end
local function minHi(a, b)
  if lt(b, a) then return b end
  return a
end

local function parsedeps(e)
  local out, pos, n = {}, 22, #e
  while pos <= n do
    local all = string.byte(e, pos)
    local l = struct.unpack('>I2', e, pos + 1)
    local tag = string.sub(e, pos + 3, pos + 2 + l)
    pos = pos + 3 + l
    l = struct.unpack('>I2', e, pos)
    local tbl = string.sub(e, pos + 2, pos + 1 + l)
    pos = pos + 2 + l
    local nr = struct.unpack('>I2', e, pos)
    pos = pos + 2
    local reads = {}
    for i = 1, nr do
      l = struct.unpack('>I2', e, pos)
      reads[i] = string.sub(e, pos + 2, pos + 1 + l)
      pos = pos + 2 + l
    end
    out[#out + 1] = {tag = tag, tbl = tbl, all = all == 1, reads = reads}
  end
  return out
end

-- The index sets an unsettled version (member m, entry e) belongs to.
local function sets(e)
  local ds = parsedeps(e)
  if #ds == 0 then return {P .. 'nodeps'}, ds end
  local out = {}
  for _, d in ipairs(ds) do
    out[#out + 1] = P .. 't:' .. d.tag
    out[#out + 1] = P .. 'T:' .. d.tbl
  end
  return out, ds
end

local function index(m, e)
  local ss, ds = sets(e)
  for _, s in ipairs(ss) do redis.call('SADD', s, m) end
  for _, d in ipairs(ds) do redis.call('SADD', P .. 'tables', d.tbl) end
  if hiOf(e) ~= OPEN then redis.call('SADD', P .. 'closed', m) end
  return ss
end

local function unindex(m, e)
  for _, s in ipairs((sets(e))) do redis.call('SREM', s, m) end
  redis.call('SREM', P .. 'closed', m)
end

local function fingerprint(k)
  local x = tonumber(string.sub(redis.sha1hex(k), 1, 8), 16)
  if x == 0 then x = 1 end
  return struct.pack('>I4', x)
end

-- ghost remembers that key k lost its last version to eviction.
local function ghost(k)
  local n = math.floor(redis.call('STRLEN', P .. 'g') / 4)
  if n < 1 then return end
  local i = redis.call('INCR', P .. 'gi')
  redis.call('SETRANGE', P .. 'g', ((i - 1) % n) * 4, fingerprint(k))
end

local function isGhost(k)
  local ring = redis.call('GET', P .. 'g')
  if not ring then return false end
  local fp, from = fingerprint(k), 1
  while true do
    local i = string.find(ring, fp, from, true)
    if not i then return false end
    if (i - 1) % 4 == 0 then return true end
    from = i + 1
  end
end

-- forget drops version snap of key k, whose value Redis evicted (or
-- which a put replaces): its entry, its index memberships, its count.
local function forget(k, snap, e)
  local m = snap .. k
  if not isSettled(e) then unindex(m, e) end
  redis.call('HDEL', dkey(k), snap)
  redis.call('HINCRBY', P .. 'n', 'versions', -1)
  redis.call('HINCRBY', P .. 'n', 'bytes', -sizeOf(e))
  if redis.call('EXISTS', dkey(k)) == 0 then
    redis.call('HINCRBY', P .. 'n', 'keys', -1)
    ghost(k)
  end
end

-- live returns the entry of index member m of set s if it is an unsettled
-- version whose value is still there; otherwise it cleans m up (from s and,
-- for an evicted version, from everywhere) and returns nil. EXISTS does not
-- touch the value's LRU clock.
local function live(s, m)
  local snap, k = string.sub(m, 1, 8), string.sub(m, 9)
  local e = redis.call('HGET', dkey(k), snap)
  if e and not isSettled(e) then
    if redis.call('EXISTS', vkey(m)) == 1 then return e end
    forget(k, snap, e)
  end
  redis.call('SREM', s, m)
  return nil
end
`

// lookup: ARGV prefix, key, tmin, tmax, watermark + 1 (OPEN for no
// limit). Returns {0, lo, hi, snapshot, value} on a hit (hi as stored),
// {missClass} on a miss.
const lookupSrc = `#!lua flags=allow-oom
` + lib + `
local k, tmin, tmax, wm1 = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local all = redis.call('HGETALL', dkey(k))
if #all == 0 then
  if isGhost(k) then return {CAPACITY} end
  return {COMPULSORY}
end
local hits, rest = {}, {}
for i = 1, #all, 2 do
  local snap, e = all[i], all[i + 1]
  local v = {snap = snap, e = e, pending = string.byte(e, 17) % 2 == 1}
  if v.pending then
    rest[#rest + 1] = v
  else
    local lo, hi = string.sub(e, 1, 8), hiOf(e)
    -- Every version is served up to the watermark: [lo, min(hi, wm+1)).
    if hi == OPEN or not LEGACY then hi = minHi(hi, wm1) end
    local newer, empty, ended
    if hi ~= OPEN then
      newer, empty, ended = lt(tmax, lo), not lt(lo, hi), not lt(tmin, hi)
    else
      newer, empty, ended = lt(tmax, lo), lo == OPEN, tmin == OPEN
    end
    if newer or empty or ended then
      v.consistency = newer or empty
      rest[#rest + 1] = v
    else
      hits[#hits + 1] = v
    end
  end
end
table.sort(hits, function(a, b) return lt(b.snap, a.snap) end)
for _, v in ipairs(hits) do
  local val = redis.call('GET', vkey(v.snap .. k))
  if val then
    return {0, string.sub(v.e, 1, 8), hiOf(v.e), v.snap, val}
  end
  forget(k, v.snap, v.e)
end
local miss, held = COMPULSORY, false
for _, v in ipairs(rest) do
  if redis.call('EXISTS', vkey(v.snap .. k)) == 0 then
    forget(k, v.snap, v.e)
  else
    held = true
    if v.consistency then
      miss = CONSISTENCY
    elseif not v.pending and miss ~= CONSISTENCY then
      miss = STALENESS
    end
  end
end
if not held then return {CAPACITY} end
return {miss}
`

// put: ARGV prefix, key, snapshot, entry, value, ttl in ms. Returns 1 when
// it stored a version, 0 when one with the snapshot was there.
const putSrc = `#!lua
` + lib + `
local k, snap, e, val, ttl = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local m = snap .. k
local old = redis.call('HGET', dkey(k), snap)
if old then
  if redis.call('EXISTS', vkey(m)) == 1 then
    redis.call('PEXPIRE', vkey(m), ttl)
    return 0
  end
  forget(k, snap, old)
end
local fresh = redis.call('EXISTS', dkey(k)) == 0
redis.call('HSET', dkey(k), snap, e)
redis.call('SET', vkey(m), val, 'PX', ttl)
redis.call('HINCRBY', P .. 'n', 'versions', 1)
redis.call('HINCRBY', P .. 'n', 'bytes', sizeOf(e))
if fresh then redis.call('HINCRBY', P .. 'n', 'keys', 1) end
-- Clean a few random members of the sets it joined: dangling members
-- (evicted versions nobody told the store about) stay a bounded share.
for _, s in ipairs(index(m, e)) do
  for _, x in ipairs(redis.call('SRANDMEMBER', s, 2)) do
    if x ~= m then live(s, x) end
  end
end
return 1
`

// confirm: ARGV prefix, key, snapshot, lo, hi.
const confirmSrc = `#!lua flags=allow-oom
` + lib + `
local k, snap, lo, hi = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local e = redis.call('HGET', dkey(k), snap)
if not e then return 0 end
hi = minHi(hiOf(e), hi)
local flags = string.byte(e, 17)
redis.call('HSET', dkey(k), snap, lo .. hi .. string.char(flags - flags % 2) .. string.sub(e, 18))
if hi ~= OPEN and not isSettled(e) then redis.call('SADD', P .. 'closed', snap .. k) end
return 1
`

// invalidate: KEYS the index set of each change (the table set for a
// flush); ARGV prefix, lsn, then per change: flags (1 flush, 2 rows, 4 all
// columns), tag, number of columns, the columns. Every unsettled version
// (the sets hold exactly those), open or closed, computed before lsn that a
// change hits gets hi = min(hi, lsn). Returns how many versions it
// shortened.
const invalidateSrc = `#!lua flags=allow-oom
` + lib + `
local lsn = ARGV[2]
local ended, a = 0, 3
for c = 1, #KEYS do
  local s = KEYS[c]
  local f, tag, nc = tonumber(ARGV[a]), ARGV[a + 1], tonumber(ARGV[a + 2])
  local cols = {}
  for j = 1, nc do cols[ARGV[a + 2 + j]] = true end
  a = a + 3 + nc
  local always = f > 0
  for _, m in ipairs(redis.call('SMEMBERS', s)) do
    local snap = string.sub(m, 1, 8)
    if lt(snap, lsn) then
      local k = string.sub(m, 9)
      local e = redis.call('HGET', dkey(k), snap)
      if not e or isSettled(e) then
        redis.call('SREM', s, m)
      elseif LEGACY and hiOf(e) ~= OPEN then
        -- a closed version is final
      else
        local hit = always
        if not hit then
          for _, d in ipairs(parsedeps(e)) do
            if d.tag == tag then
              if d.all then
                hit = nc > 0
              else
                for _, r in ipairs(d.reads) do
                  if cols[r] then hit = true break end
                end
              end
              if hit then break end
            end
          end
        end
        if hit then
          if redis.call('EXISTS', vkey(m)) == 0 then
            forget(k, snap, e)
            redis.call('SREM', s, m)
          elseif lt(lsn, hiOf(e)) then
            redis.call('HSET', dkey(k), snap, withHi(e, lsn))
            redis.call('SADD', P .. 'closed', m)
            ended = ended + 1
          end
        end
      end
    end
  end
end
return ended
`

// endOpen: ARGV prefix, hi. Every version, open or closed, ends at hi at
// the latest and is settled. The unsettled ones are in the set of one of
// their tables, or in the set of versions without dependencies; a settled
// one already ends at or before hi (see store.Backend.EndOpen).
const endOpenSrc = `#!lua flags=allow-oom
` + lib + `
local hi = ARGV[2]
local ended = 0
local function endAll(s)
  for _, m in ipairs(redis.call('SMEMBERS', s)) do
    local snap, k = string.sub(m, 1, 8), string.sub(m, 9)
    local e = redis.call('HGET', dkey(k), snap)
    if e and not isSettled(e) then
      local h = hiOf(e)
      if h == OPEN or not LEGACY then h = minHi(h, hi) end
      if h ~= hiOf(e) then ended = ended + 1 end
      redis.call('HSET', dkey(k), snap, settledEntry(withHi(e, h)))
      unindex(m, e)
    end
  end
  redis.call('DEL', s)
end
for _, t in ipairs(redis.call('SMEMBERS', P .. 'tables')) do
  endAll(P .. 'T:' .. t)
  redis.call('SREM', P .. 'tables', t)
end
endAll(P .. 'nodeps')
redis.call('DEL', P .. 'closed')
return ended
`

// settle: ARGV prefix, watermark + 1 (OPEN for no limit), the watermark in
// decimal. It saves the watermark and settles every closed version with hi
// <= watermark + 1, in one step: a copy of the data (an append-only file)
// never holds a version settled beyond the watermark it saved.
const settleSrc = `#!lua flags=allow-oom
` + lib + `
local wm1, wm = ARGV[2], ARGV[3]
redis.call('SET', P .. 'wm', wm)
local settled = 0
for _, m in ipairs(redis.call('SMEMBERS', P .. 'closed')) do
  local snap, k = string.sub(m, 1, 8), string.sub(m, 9)
  local e = redis.call('HGET', dkey(k), snap)
  if not e or isSettled(e) then
    redis.call('SREM', P .. 'closed', m)
  elseif hiOf(e) ~= OPEN and not lt(wm1, hiOf(e)) then
    unindex(m, e)
    redis.call('HSET', dkey(k), snap, settledEntry(e))
    settled = settled + 1
  end
end
return settled
`

// saveWatermark: ARGV prefix, the watermark in decimal. A script, so that
// it fails on a server that lost the store's scripts (a restart).
const saveWatermarkSrc = `#!lua flags=allow-oom
redis.call('SET', ARGV[1] .. 'wm', ARGV[2])
return 0
`

// holds: KEYS the index sets asked about; ARGV prefix. Returns 1 or 0 per
// set: whether it has a live member.
const holdsSrc = `#!lua flags=allow-oom
` + lib + `
local out = {}
for i, s in ipairs(KEYS) do
  out[i] = 0
  while true do
    local m = redis.call('SRANDMEMBER', s)
    if not m then break end
    if live(s, m) then out[i] = 1 break end
  end
end
return out
`

// forgetEvicted: ARGV prefix, key, snapshot: Redis reported the value of
// this version evicted or expired. A put may have stored it again since.
const forgetEvictedSrc = `#!lua flags=allow-oom
` + lib + `
local k, snap = ARGV[2], ARGV[3]
if redis.call('EXISTS', vkey(snap .. k)) == 1 then return 0 end
local e = redis.call('HGET', dkey(k), snap)
if not e then return 0 end
forget(k, snap, e)
return 1
`

// initGhosts: KEYS ring, ring cursor; ARGV ring bytes. A ring of another
// size is started afresh.
const initGhostsSrc = `#!lua flags=allow-oom
local n = tonumber(ARGV[1])
if redis.call('STRLEN', KEYS[1]) ~= n then
  redis.call('DEL', KEYS[1])
  redis.call('SETRANGE', KEYS[1], n - 1, '\0')
  redis.call('SET', KEYS[2], 0)
end
return 0
`

// warm: KEYS three scratch keys. It calls once every command the scripts
// use, then deletes the keys: a server allocates some bookkeeping for a
// command (a latency histogram) the first time it runs, and New measures
// the baseline after that.
const warmSrc = `#!lua flags=allow-oom
local h, s, v = KEYS[1], KEYS[2], KEYS[3]
redis.call('HSET', h, 'f', 'x')
redis.call('HGET', h, 'f')
redis.call('HGETALL', h)
redis.call('HINCRBY', h, 'n', 1)
redis.call('HMGET', h, 'f', 'n')
redis.call('HDEL', h, 'f')
redis.call('SADD', s, 'm')
redis.call('SRANDMEMBER', s)
redis.call('SMEMBERS', s)
redis.call('SREM', s, 'm')
redis.call('SET', v, '1', 'PX', 60000)
redis.call('PEXPIRE', v, 60000)
redis.call('GET', v)
redis.call('EXISTS', v)
redis.call('STRLEN', v)
redis.call('INCR', v)
redis.call('SETRANGE', v, 0, '1')
redis.call('DEL', h, s, v)
return 0
`

var (
	warmScript       = redis.NewScript(warmSrc)
	initGhostsScript = redis.NewScript(initGhostsSrc)
)

// scripts are one Store's copies of the scripts that read or change its
// data.
type scripts struct {
	lookup, put, confirm, invalidate, endOpen, settle, saveWatermark, holds, forgetEvicted *redis.Script

	all []*redis.Script
}

// newScripts makes the scripts of one store: token goes into their
// source, so that their SHA1s are the store's own; legacy makes a closed
// version final (store.OrderDependentForTest).
func newScripts(token string, legacy bool) *scripts {
	mk := func(src string) *redis.Script {
		shebang, body, _ := strings.Cut(src, "\n")
		if legacy {
			body = strings.Replace(body, "local LEGACY = false", "local LEGACY = true", 1)
		}
		sc := redis.NewScript(shebang + "\n-- store " + token + "\n" + body)
		return sc
	}
	s := &scripts{
		lookup: mk(lookupSrc), put: mk(putSrc), confirm: mk(confirmSrc), invalidate: mk(invalidateSrc),
		endOpen: mk(endOpenSrc), settle: mk(settleSrc), saveWatermark: mk(saveWatermarkSrc),
		holds: mk(holdsSrc), forgetEvicted: mk(forgetEvictedSrc),
	}
	s.all = []*redis.Script{s.lookup, s.put, s.confirm, s.invalidate, s.endOpen, s.settle, s.saveWatermark, s.holds, s.forgetEvicted}
	return s
}
