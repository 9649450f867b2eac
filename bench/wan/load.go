package wan

import (
	"context"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/larderdb/larder/bench/rubis/datagen"
	"github.com/larderdb/larder/bench/rubis/mix"
)

// request is one page an emulated user asks for.
type request struct {
	name string
	post bool
	path string // with its query, for a GET
	body string // form, for a POST
}

// user walks a mix: it returns its next request; ok after the answer's
// status tells it whether the page worked.
type user interface {
	next() request
}

// Stats are one measured run's figures.
type Stats struct {
	Requests int64   `json:"requests"`
	Errors   int64   `json:"errors"`
	Seconds  float64 `json:"seconds"`
	// Rate is requests per second; Mean and P90 the response times in
	// milliseconds.
	Rate   float64 `json:"rate"`
	MeanMS float64 `json:"mean_ms"`
	P90MS  float64 `json:"p90_ms"`
	// BodyBytes are the pages' bytes the users received.
	BodyBytes int64 `json:"body_bytes"`
}

// drive runs vus users against base for d; users are made by newUser.
// Requests that end after d are not counted.
func drive(ctx context.Context, base string, vus int, d time.Duration, newUser func(vu int) user) Stats {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var mu sync.Mutex
	var lat []time.Duration
	var st Stats
	var wg sync.WaitGroup
	tr := &http.Transport{MaxIdleConnsPerHost: vus + 4}
	defer tr.CloseIdleConnections()
	start := time.Now()
	for vu := range vus {
		wg.Add(1)
		go func() {
			defer wg.Done()
			jar, _ := cookiejar.New(nil)
			hc := &http.Client{Transport: tr, Jar: jar}
			u := newUser(vu)
			for ctx.Err() == nil {
				rq := u.next()
				t0 := time.Now()
				n, ok := do(ctx, hc, base, rq)
				el := time.Since(t0)
				if ctx.Err() != nil {
					return
				}
				mu.Lock()
				st.Requests++
				st.BodyBytes += n
				if !ok {
					st.Errors++
				}
				lat = append(lat, el)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	st.Seconds = time.Since(start).Seconds()
	st.Rate = float64(st.Requests) / st.Seconds
	if len(lat) > 0 {
		slices.Sort(lat)
		var sum time.Duration
		for _, l := range lat {
			sum += l
		}
		st.MeanMS = float64(sum.Microseconds()) / 1e3 / float64(len(lat))
		st.P90MS = float64(lat[(len(lat)*9)/10].Microseconds()) / 1e3
	}
	return st
}

// do sends rq and reads the page; ok when RUBiS answered it (2xx/3xx,
// or its own 404 and 409).
func do(ctx context.Context, hc *http.Client, base string, rq request) (int64, bool) {
	var req *http.Request
	var err error
	if rq.post {
		req, err = http.NewRequestWithContext(ctx, http.MethodPost, base+"/"+rq.path, strings.NewReader(rq.body))
		if err == nil {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
	} else {
		req, err = http.NewRequestWithContext(ctx, http.MethodGet, base+"/"+rq.path, nil)
	}
	if err != nil {
		return 0, false
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	n, _ := io.Copy(io.Discard, resp.Body)
	ok := resp.StatusCode < 400 || resp.StatusCode == 404 || resp.StatusCode == 409
	return n, ok
}

// rubisUser walks the RUBiS transition table of a mix, with the k6
// script's parameters (bench/rubis/k6/rubis.js) and no think time.
type rubisUser struct {
	w    *mix.Walker
	r    *rand.Rand
	size datagen.Size
	user int
	vu   int
	n    int
}

func newRUBiSUser(t *mix.Table, size datagen.Size, vu int, seed int64) *rubisUser {
	r := rand.New(rand.NewSource(seed))
	return &rubisUser{w: mix.NewWalker(t, seed), r: r, size: size, vu: vu, user: 1 + r.Intn(max(size.Users, 1))}
}

func (u *rubisUser) rnd(n int) int { return 1 + u.r.Intn(max(n, 1)) }

func (u *rubisUser) next() request {
	state := u.w.Next()
	if state == "Home" {
		u.user = u.rnd(u.size.Users)
	}
	u.n++
	q := u.params(state)
	if mix.Writes[state] {
		return request{name: state, post: true, path: state, body: q}
	}
	if q != "" {
		return request{name: state, path: state + "?" + q}
	}
	return request{name: state, path: state}
}

func (u *rubisUser) params(state string) string {
	auth := fmt.Sprintf("nickname=user%d&password=password%d", u.user, u.user)
	s := u.size
	switch state {
	case "RegisterUser":
		return fmt.Sprintf("nickname=wan%dx%dx%d&password=pw&email=w@x&region=region%d&firstname=W&lastname=A", u.vu, u.n, u.r.Int63(), u.rnd(s.Regions))
	case "SearchItemsInCategory":
		return fmt.Sprintf("category=%d&page=0", u.rnd(s.Categories))
	case "BrowseCategoriesInRegion":
		return fmt.Sprintf("region=%d", u.rnd(s.Regions))
	case "SearchItemsInRegion":
		return fmt.Sprintf("category=%d&region=%d&page=0", u.rnd(s.Categories), u.rnd(s.Regions))
	case "ViewItem", "ViewBidHistory":
		return fmt.Sprintf("itemId=%d", u.rnd(s.ActiveItems))
	case "ViewUserInfo":
		return fmt.Sprintf("userId=%d", u.rnd(s.Users))
	case "BuyNow", "PutBid":
		return fmt.Sprintf("%s&itemId=%d", auth, u.rnd(s.ActiveItems))
	case "StoreBuyNow":
		return fmt.Sprintf("userId=%d&itemId=%d&qty=1", u.user, u.rnd(s.ActiveItems))
	case "StoreBid":
		b := u.rnd(5000)
		return fmt.Sprintf("userId=%d&itemId=%d&bid=%d&maxBid=%d&qty=1", u.user, u.rnd(s.ActiveItems), b, b+u.rnd(50))
	case "PutComment":
		return fmt.Sprintf("%s&itemId=%d&to=%d", auth, u.rnd(s.ActiveItems), u.rnd(s.Users))
	case "StoreComment":
		return fmt.Sprintf("from=%d&to=%d&itemId=%d&rating=%d&comment=wan", u.user, u.rnd(s.Users), u.rnd(s.ActiveItems), u.rnd(11)-6)
	case "SelectCategoryToSellItem", "AboutMe":
		return auth
	case "RegisterItem":
		return fmt.Sprintf("userId=%d&categoryId=%d&initialPrice=%d&quantity=1&duration=%d&name=wanitem", u.user, u.rnd(s.Categories), u.rnd(5000), u.rnd(7))
	}
	return ""
}

// listingUser reads the data-heavy Listing page of a random category.
type listingUser struct {
	r    *rand.Rand
	size datagen.Size
}

func (u *listingUser) next() request {
	return request{name: "Listing", path: "Listing?" + url.Values{"category": {fmt.Sprint(1 + u.r.Intn(max(u.size.Categories, 1)))}}.Encode()}
}

// bidder places a bid on a random open item every interval until ctx
// ends (the data-heavy mix's writer, not measured): each bid changes an
// item's max_bid and nb_of_bids, which Listing pages show.
func bidder(ctx context.Context, base string, size datagen.Size, every time.Duration, seed int64) (bids int64) {
	r := rand.New(rand.NewSource(seed))
	hc := &http.Client{}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return bids
		case <-t.C:
		}
		b := 1 + r.Intn(5000)
		body := fmt.Sprintf("userId=%d&itemId=%d&bid=%d&maxBid=%d&qty=1", 1+r.Intn(max(size.Users, 1)), 1+r.Intn(max(size.ActiveItems, 1)), b, b+10)
		if _, ok := do(ctx, hc, base, request{post: true, path: "StoreBid", body: body}); ok {
			bids++
		}
	}
}

func newRand(seed int64) *rand.Rand { return rand.New(rand.NewSource(seed)) }
