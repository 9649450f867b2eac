// RUBiS client emulator for k6: each virtual user walks a transition table
// (bidding or browsing, the original tables) as the original emulator did —
// Back pops a history stack, End of Session starts again at Home with a new
// user, a session ends after 1000 requests — with TPC-W think times.
//
//   k6 run -e BASE_URL=http://127.0.0.1:8080 -e MIX=bidding -e THINK=1 rubis.js
//
// Environment: BASE_URL (several, comma-separated: application servers,
// virtual user k on the ((k-1) mod n)-th, as a client bound to its
// server); MIX (bidding|browsing); THINK (think-time factor,
// 0 for peak runs); USERS, ITEMS, CATEGORIES, REGIONS (the database's sizes);
// VUS and DURATION, or STAGES as "30s:10,60s:10,30s:0" (ramp-up, measure, ramp-down).
import http from 'k6/http';
import { sleep } from 'k6';
import exec from 'k6/execution';

// RUBiS's own answers are not failures: an item or user not found (404),
// a nickname taken or an item sold out (409). Anything else outside 2xx/3xx
// is (http_req_failed).
http.setResponseCallback(http.expectedStatuses({ min: 200, max: 399 }, 404, 409));

const STATES = [
  'Home', 'Register', 'RegisterUser', 'Browse', 'BrowseCategories', 'SearchItemsInCategory',
  'BrowseRegions', 'BrowseCategoriesInRegion', 'SearchItemsInRegion', 'ViewItem', 'ViewUserInfo',
  'ViewBidHistory', 'BuyNowAuth', 'BuyNow', 'StoreBuyNow', 'PutBidAuth', 'PutBid', 'StoreBid',
  'PutCommentAuth', 'PutComment', 'StoreComment', 'Sell', 'SelectCategoryToSellItem', 'SellItemForm',
  'RegisterItem', 'AboutMeAuth', 'AboutMe',
];
const BACK = STATES.length;
const END = STATES.length + 1;
const MAX_SESSION = 1000;

const MIX = __ENV.MIX || 'bidding';
const TABLE = parse(open(`../mix/${MIX}_transitions.tsv`));
const BASES = (__ENV.BASE_URL || 'http://127.0.0.1:8080').split(',');
const THINK = parseFloat(__ENV.THINK === undefined ? '1' : __ENV.THINK);
const USERS = parseInt(__ENV.USERS || '1000');
const ITEMS = parseInt(__ENV.ITEMS || '1000');
const CATEGORIES = parseInt(__ENV.CATEGORIES || '20');
const REGIONS = parseInt(__ENV.REGIONS || '62');

function stages() {
  if (!__ENV.STAGES) return undefined;
  return __ENV.STAGES.split(',').map((s) => {
    const [duration, target] = s.split(':');
    return { duration, target: parseInt(target) };
  });
}

// A threshold per interaction makes k6's summary report each one's latency.
const thresholds = {};
for (const s of STATES) thresholds[`http_req_duration{name:${s}}`] = ['max>=0'];

export const options = Object.assign(
  __ENV.STAGES ? { stages: stages() } : { vus: parseInt(__ENV.VUS || '1'), duration: __ENV.DURATION || '10s' },
  // The emulator draws its next page from the table, never from a page's
  // body: bodies are dropped as they arrive, not kept as JavaScript
  // strings (k6 shares the machine with what it measures).
  { thresholds, summaryTrendStats: ['avg', 'p(50)', 'p(90)', 'p(99)', 'max'], discardResponseBodies: true },
);

// parse reads the original table: one row per "to" state (27, Back, End of
// Session), one column per "from" state, the think time in ms last.
export function parse(text) {
  const p = STATES.map(() => new Array(STATES.length + 2).fill(0));
  let row = 0;
  for (const line of text.split('\n')) {
    const f = line.split('\t');
    if (f.length < STATES.length + 1) continue;
    if (row === 0 && f[0].trim() !== 'Home') continue;
    if (row >= STATES.length + 2) break;
    for (let from = 0; from < STATES.length; from++) {
      const v = parseFloat(f[1 + from]);
      if (isNaN(v) || v < 0) throw new Error(`bad probability in row ${f[0]}`);
      p[from][row] = v;
    }
    row++;
  }
  if (row !== STATES.length + 2) throw new Error('transition table has fewer than 29 rows');
  return p;
}

function rand(n) { return 1 + Math.floor(Math.random() * n); }

// params gives a page the parameters it needs, for the session's user.
function params(state, user) {
  const auth = `nickname=user${user}&password=password${user}`;
  switch (state) {
    case 'RegisterUser':
      return `nickname=k6u${exec.vu.idInTest}x${Date.now()}${rand(1e6)}&password=pw&email=k6@x&region=region${rand(REGIONS)}&firstname=K&lastname=S`;
    case 'SearchItemsInCategory': return `category=${rand(CATEGORIES)}&page=0`;
    case 'BrowseCategoriesInRegion': return `region=${rand(REGIONS)}`;
    case 'SearchItemsInRegion': return `category=${rand(CATEGORIES)}&region=${rand(REGIONS)}&page=0`;
    case 'ViewItem': case 'ViewBidHistory': return `itemId=${rand(ITEMS)}`;
    case 'ViewUserInfo': return `userId=${rand(USERS)}`;
    case 'BuyNow': case 'PutBid': return `${auth}&itemId=${rand(ITEMS)}`;
    case 'StoreBuyNow': return `userId=${user}&itemId=${rand(ITEMS)}&qty=1`;
    case 'StoreBid': { const b = rand(5000); return `userId=${user}&itemId=${rand(ITEMS)}&bid=${b}&maxBid=${b + rand(50)}&qty=1`; }
    case 'PutComment': return `${auth}&itemId=${rand(ITEMS)}&to=${rand(USERS)}`;
    case 'StoreComment': return `from=${user}&to=${rand(USERS)}&itemId=${rand(ITEMS)}&rating=${rand(11) - 6}&comment=k6`;
    case 'SelectCategoryToSellItem': case 'AboutMe': return auth;
    case 'RegisterItem': return `userId=${user}&categoryId=${rand(CATEGORIES)}&initialPrice=${rand(5000)}&quantity=1&duration=${rand(7)}&name=k6item`;
    default: return '';
  }
}

const WRITES = new Set(['RegisterUser', 'StoreBuyNow', 'StoreBid', 'StoreComment', 'RegisterItem']);

function thinkTime() {
  if (THINK <= 0) return 0;
  const t = -7000 * Math.log(1 - Math.random());
  return t > 70000 ? 0 : (t * THINK) / 1000;
}

// One iteration is one session.
export default function () {
  const table = TABLE;
  const BASE = BASES[(exec.vu.idInTest - 1) % BASES.length];
  const user = rand(USERS);
  let cur = 0;
  const history = [];
  for (let n = 0; n < MAX_SESSION; n++) {
    const state = STATES[cur];
    const q = params(state, user);
    const url = `${BASE}/${state}${q ? '?' + q : ''}`;
    const res = WRITES.has(state)
      ? http.post(`${BASE}/${state}`, q, { tags: { name: state }, headers: { 'Content-Type': 'application/x-www-form-urlencoded' } })
      : http.get(url, { tags: { name: state } });
    // An error page goes Home; an empty search goes Back.
    if (res.status >= 500 || res.status === 401) {
      cur = 0;
      history.length = 0;
      continue;
    }
    const s = thinkTime();
    if (s > 0) sleep(s);
    // Draw the next state down the current column.
    const r = Math.random();
    let sum = 0;
    let next = cur;
    for (let to = 0; to < table[cur].length; to++) {
      sum += table[cur][to];
      if (r < sum) { next = to; break; }
    }
    if (next === END) return;
    if (next === BACK) {
      next = history.length ? history.pop() : 0;
    } else {
      history.push(cur);
    }
    cur = next;
  }
}
