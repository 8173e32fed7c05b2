// burst-prefix's placer as a BLIS routing policy (added to a BLIS checkout by `make bench-blis`,
// with register.patch; kept in the burst-prefix repository, bench/blis/).
//
// For each routed request it asks the burst-prefix placer, a separate process started by the bench,
// where to send it, over two named pipes given in the environment (BURST_PREFIX_TO_PLACER,
// BURST_PREFIX_FROM_PLACER), one JSON line each way per request. It tells the placer only what a
// producer in front of real engines would know:
//   - the request's prompt tokens (never its output tokens or their count);
//   - for the requests routed earlier, when their first token and their last came out and how many
//     tokens the answer had, as a proxy reading the stream sees them, once the simulated clock has
//     passed that time;
//   - the instances' load (requests running and waiting, as vLLM's /metrics says it) from BLIS's
//     snapshots, at most every loadIntervalUs, which the placer asks for in its first line (0: never).
// The placer answers with the instance id; anything else stops the run with its message.

package sim

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
)

type burstPrefixPolicy struct {
	toPlacer   *bufio.Writer
	fromPlacer *bufio.Reader
	// Load is sent at most this often (simulated us); 0: never.
	loadEveryUs   int64
	lastLoadUs    int64
	sentInstances bool
	// Routed and not yet reported finished, with what was reported of each.
	pending []*burstPrefixRouted
}

type burstPrefixRouted struct {
	req       *Request
	firstSent bool
}

type burstPrefixHello struct {
	LoadIntervalUs int64 `json:"loadIntervalUs"`
}

type burstPrefixEvent struct {
	ID string `json:"id"`
	// Simulated us.
	At int64 `json:"at"`
	// "first" (its first token) or "done" (its last).
	Kind string `json:"kind"`
	// The answer's tokens, on "done".
	Tokens int `json:"tokens,omitempty"`
}

type burstPrefixLoad struct {
	ID string `json:"id"`
	// Requests running and waiting (vLLM's num_requests_running + num_requests_waiting).
	Requests int `json:"requests"`
}

type burstPrefixAsk struct {
	Clock     int64              `json:"clock"`
	Instances []string           `json:"instances,omitempty"`
	Events    []burstPrefixEvent `json:"events,omitempty"`
	Load      []burstPrefixLoad  `json:"load,omitempty"`
	ID        string             `json:"id"`
	Tokens    []TokenID          `json:"tokens"`
}

type burstPrefixAnswer struct {
	Instance string `json:"instance"`
	Error    string `json:"error"`
}

func newBurstPrefixPolicy() *burstPrefixPolicy {
	to, from := os.Getenv("BURST_PREFIX_TO_PLACER"), os.Getenv("BURST_PREFIX_FROM_PLACER")
	if to == "" || from == "" {
		panic("routing policy burst-prefix: BURST_PREFIX_TO_PLACER and BURST_PREFIX_FROM_PLACER must name the placer's pipes (make bench-blis sets them)")
	}
	// The same order as the placer opens them (a pipe's open waits for its other end).
	w, err := os.OpenFile(to, os.O_WRONLY, 0)
	if err != nil {
		panic(fmt.Sprintf("routing policy burst-prefix: %v", err))
	}
	r, err := os.Open(from)
	if err != nil {
		panic(fmt.Sprintf("routing policy burst-prefix: %v", err))
	}
	p := &burstPrefixPolicy{toPlacer: bufio.NewWriterSize(w, 1<<20), fromPlacer: bufio.NewReaderSize(r, 1<<16), lastLoadUs: -1}
	var hello burstPrefixHello
	p.read(&hello)
	p.loadEveryUs = hello.LoadIntervalUs
	return p
}

func (p *burstPrefixPolicy) read(v any) {
	line, err := p.fromPlacer.ReadBytes('\n')
	if err != nil {
		panic(fmt.Sprintf("routing policy burst-prefix: the placer closed its pipe: %v", err))
	}
	if err := json.Unmarshal(line, v); err != nil {
		panic(fmt.Sprintf("routing policy burst-prefix: the placer said %q: %v", line, err))
	}
}

// Route implements RoutingPolicy.
func (p *burstPrefixPolicy) Route(req *Request, state *RouterState) RoutingDecision {
	if len(state.Snapshots) == 0 {
		panic("burstPrefixPolicy.Route: empty snapshots")
	}
	ask := burstPrefixAsk{Clock: state.Clock, ID: req.ID, Tokens: req.InputTokens}
	if !p.sentInstances {
		for _, snap := range state.Snapshots {
			ask.Instances = append(ask.Instances, snap.ID)
		}
		p.sentInstances = true
	}
	ask.Events = p.events(state.Clock)
	if p.loadEveryUs > 0 && (p.lastLoadUs < 0 || state.Clock-p.lastLoadUs >= p.loadEveryUs) {
		p.lastLoadUs = state.Clock
		for _, snap := range state.Snapshots {
			ask.Load = append(ask.Load, burstPrefixLoad{ID: snap.ID, Requests: snap.QueueDepth + snap.BatchSize})
		}
	}
	line, err := json.Marshal(ask)
	if err != nil {
		panic(fmt.Sprintf("routing policy burst-prefix: %v", err))
	}
	if _, err := p.toPlacer.Write(append(line, '\n')); err != nil {
		panic(fmt.Sprintf("routing policy burst-prefix: the placer closed its pipe: %v", err))
	}
	if err := p.toPlacer.Flush(); err != nil {
		panic(fmt.Sprintf("routing policy burst-prefix: the placer closed its pipe: %v", err))
	}
	var answer burstPrefixAnswer
	p.read(&answer)
	if answer.Error != "" || answer.Instance == "" {
		panic(fmt.Sprintf("routing policy burst-prefix: the placer refused %s: %s", req.ID, answer.Error))
	}
	p.pending = append(p.pending, &burstPrefixRouted{req: req})
	return NewRoutingDecision(answer.Instance, "burst-prefix")
}

// events: what a proxy would have seen of the requests routed earlier by simulated time `now`.
func (p *burstPrefixPolicy) events(now int64) []burstPrefixEvent {
	var events []burstPrefixEvent
	kept := p.pending[:0]
	for _, routed := range p.pending {
		req := routed.req
		if req.TTFTSet && !routed.firstSent {
			at := req.ArrivalTime + req.FirstTokenTime
			if at <= now {
				events = append(events, burstPrefixEvent{ID: req.ID, At: at, Kind: "first"})
				routed.firstSent = true
			}
		}
		if req.State == StateCompleted || req.State == StateTimedOut {
			// A preemption clears ITL and moves FirstTokenTime to the prefill that finished it.
			var decoding int64
			for _, itl := range req.ITL {
				decoding += itl
			}
			at := req.ArrivalTime + req.FirstTokenTime + decoding
			if routed.firstSent && at <= now {
				events = append(events, burstPrefixEvent{ID: req.ID, At: at, Kind: "done", Tokens: len(req.OutputTokens)})
				continue
			}
		}
		kept = append(kept, routed)
	}
	p.pending = kept
	return events
}
