// The HTTP client of bench.server's (h): the same one-at-a-time cycles and fan-in as its httpx
// client, from a Go program (standard library only), so that the client's own CPU per request
// stays small beside the server's.
//
//	httpclient URL TOKEN
//
// Reads one JSON job per line on stdin and answers each with one JSON line on stdout:
//
//	{"kind": "cycles", "domain": D, "queue": Q, "messages": [{"id": ID, "body": BASE64}, ...]}
//	{"kind": "fanin", "domain": D, "queue": Q, "warmup": W, "clients": [[message, ...], ...],
//	 "domains": [D, ...] (optional: client i enqueues to the queue Q of domains[i % len], not to D's)}
//
// cycles: enqueue → receive (max_messages 1) → ack per message, one at a time, on one keep-alive
// connection kept across jobs; each delivery must be the message just enqueued, with its body.
// fanin: one goroutine and connection per client, W untimed Enqueues each, then all released
// together on the rest, one at a time; wall clock from the release until the last one finished.
//
// The answer: {"seconds": wall, "cpu_s": this process's user+system CPU over the timed part,
// "latencies": {step: [seconds, ...]}, "statuses": {code: count}}, or {"error": why}.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"syscall"
	"time"
)

type message struct {
	ID   string `json:"id"`
	Body string `json:"body"`
}

type job struct {
	Kind     string      `json:"kind"`
	Domain   string      `json:"domain"`
	Queue    string      `json:"queue"`
	Messages []message   `json:"messages"`
	Warmup   int         `json:"warmup"`
	Clients  [][]message `json:"clients"`
	Domains  []string    `json:"domains"`
}

// domainOf is the domain fan-in client i enqueues to.
func (j job) domainOf(i int) string {
	if len(j.Domains) == 0 {
		return j.Domain
	}
	return j.Domains[i%len(j.Domains)]
}

type answer struct {
	Seconds   float64              `json:"seconds"`
	CPU       float64              `json:"cpu_s"`
	Latencies map[string][]float64 `json:"latencies"`
	Statuses  map[int]int          `json:"statuses"`
	Error     string               `json:"error,omitempty"`
}

// client is one keep-alive connection to the API with the bearer token.
type client struct {
	base, token string
	http        *http.Client
	statuses    map[int]int
}

func newClient(base, token string) *client {
	transport := &http.Transport{MaxIdleConnsPerHost: 1, MaxConnsPerHost: 1, DisableCompression: true}
	return &client{base, token, &http.Client{Transport: transport, Timeout: 60 * time.Second}, map[int]int{}}
}

// post sends one request and decodes the committed result of a 200 answer into result.
func (c *client) post(path string, body any, key string, result any) error {
	encoded, err := json.Marshal(body)
	if err != nil {
		return err
	}
	request, err := http.NewRequest(http.MethodPost, c.base+path, bytes.NewReader(encoded))
	if err != nil {
		return err
	}
	request.Header.Set("Authorization", "Bearer "+c.token)
	request.Header.Set("Content-Type", "application/json")
	if key != "" {
		request.Header.Set("Idempotency-Key", key)
	}
	response, err := c.http.Do(request)
	if err != nil {
		return fmt.Errorf("POST %s: %w", path, err)
	}
	defer response.Body.Close()
	text, err := io.ReadAll(response.Body)
	if err != nil {
		return fmt.Errorf("POST %s: %w", path, err)
	}
	c.statuses[response.StatusCode]++
	if response.StatusCode != http.StatusOK {
		return fmt.Errorf("POST %s: status %d: %.1000s", path, response.StatusCode, text)
	}
	var outcome struct {
		Status string          `json:"status"`
		Result json.RawMessage `json:"result"`
	}
	if err := json.Unmarshal(text, &outcome); err != nil {
		return fmt.Errorf("POST %s: %w", path, err)
	}
	if outcome.Status != "committed" {
		return fmt.Errorf("POST %s: status 200 with outcome %.1000s", path, text)
	}
	return json.Unmarshal(outcome.Result, result)
}

func (c *client) enqueue(domain, queue string, m message) error {
	var result struct {
		MessageID string `json:"message_id"`
	}
	path := fmt.Sprintf("/v1/domains/%s/queues/%s/messages", domain, queue)
	if err := c.post(path, map[string]string{"message_id": m.ID, "body": m.Body}, m.ID, &result); err != nil {
		return err
	}
	if result.MessageID != m.ID {
		return fmt.Errorf("enqueue %s answered for message %s", m.ID, result.MessageID)
	}
	return nil
}

type delivery struct {
	MessageID string `json:"message_id"`
	Body      string `json:"body"`
	Token     string `json:"token"`
}

func (c *client) cycle(domain, queue string, m message, steps map[string][]float64) error {
	sent := time.Now()
	if err := c.enqueue(domain, queue, m); err != nil {
		return err
	}
	inHand := time.Now()
	var received struct {
		Deliveries []delivery `json:"deliveries"`
	}
	path := fmt.Sprintf("/v1/domains/%s/queues/%s/receive", domain, queue)
	if err := c.post(path, map[string]int{"max_messages": 1}, "", &received); err != nil {
		return err
	}
	delivered := time.Now()
	if len(received.Deliveries) != 1 {
		return fmt.Errorf("receive (max_messages 1) delivered %d messages, not 1", len(received.Deliveries))
	}
	got := received.Deliveries[0]
	if got.MessageID != m.ID || got.Body != m.Body {
		return fmt.Errorf("received %s after enqueueing %s, or another body", got.MessageID, m.ID)
	}
	var acked struct {
		State string `json:"state"`
	}
	if err := c.post(fmt.Sprintf("/v1/domains/%s/leases/ack", domain), map[string]string{"token": got.Token}, "", &acked); err != nil {
		return err
	}
	done := time.Now()
	if acked.State != "acked" {
		return fmt.Errorf("an ack left its message %s", acked.State)
	}
	steps["enqueue"] = append(steps["enqueue"], inHand.Sub(sent).Seconds())
	steps["received"] = append(steps["received"], delivered.Sub(sent).Seconds())
	steps["ack"] = append(steps["ack"], done.Sub(delivered).Seconds())
	steps["cycle"] = append(steps["cycle"], done.Sub(sent).Seconds())
	return nil
}

func cpuSeconds() float64 {
	var usage syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &usage); err != nil {
		return 0
	}
	return time.Duration(usage.Utime.Nano() + usage.Stime.Nano()).Seconds()
}

func cycles(c *client, j job) answer {
	steps := map[string][]float64{}
	for k := range c.statuses {
		delete(c.statuses, k)
	}
	cpu, start := cpuSeconds(), time.Now()
	for _, m := range j.Messages {
		if err := c.cycle(j.Domain, j.Queue, m, steps); err != nil {
			return answer{Error: err.Error()}
		}
	}
	return answer{time.Since(start).Seconds(), cpuSeconds() - cpu, steps, c.statuses, ""}
}

func fanin(base, token string, j job) answer {
	clients := make([]*client, len(j.Clients))
	for i := range clients {
		clients[i] = newClient(base, token)
		defer clients[i].http.CloseIdleConnections()
		for _, m := range j.Clients[i][:j.Warmup] {
			if err := clients[i].enqueue(j.domainOf(i), j.Queue, m); err != nil {
				return answer{Error: fmt.Sprintf("client %d: %v", i, err)}
			}
		}
	}
	release := make(chan struct{})
	latencies := make([][]float64, len(clients))
	errs := make([]error, len(clients))
	finished := make([]time.Time, len(clients))
	var wait sync.WaitGroup
	for i, c := range clients {
		wait.Add(1)
		go func(i int, c *client) {
			defer wait.Done()
			<-release
			for _, m := range j.Clients[i][j.Warmup:] {
				sent := time.Now()
				if err := c.enqueue(j.domainOf(i), j.Queue, m); err != nil {
					errs[i] = fmt.Errorf("client %d: %w", i, err)
					return
				}
				latencies[i] = append(latencies[i], time.Since(sent).Seconds())
			}
			finished[i] = time.Now()
		}(i, c)
	}
	cpu, start := cpuSeconds(), time.Now()
	close(release)
	wait.Wait()
	spent := cpuSeconds() - cpu
	last := start
	merged := []float64{}
	statuses := map[int]int{}
	for i, c := range clients {
		if errs[i] != nil {
			return answer{Error: errs[i].Error()}
		}
		if finished[i].After(last) {
			last = finished[i]
		}
		merged = append(merged, latencies[i]...)
		for code, n := range c.statuses {
			statuses[code] += n
		}
	}
	return answer{last.Sub(start).Seconds(), spent, map[string][]float64{"enqueue": merged}, statuses, ""}
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: httpclient URL TOKEN")
		os.Exit(2)
	}
	base, token := os.Args[1], os.Args[2]
	single := newClient(base, token)
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<30)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var j job
		var a answer
		if err := json.Unmarshal(in.Bytes(), &j); err != nil {
			a = answer{Error: err.Error()}
		} else if j.Kind == "cycles" {
			a = cycles(single, j)
		} else if j.Kind == "fanin" {
			a = fanin(base, token, j)
		} else {
			a = answer{Error: "unknown job kind " + j.Kind}
		}
		if err := out.Encode(a); err != nil {
			os.Exit(1)
		}
	}
}
