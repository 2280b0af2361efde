// The Go client (Debian's amqp091-go) against mqgw: publish with confirms, consume with manual
// acks, request-reply over amq.rabbitmq.reply-to. Prints one JSON line; exits 0 only if every
// check passed. Usage: client URL [N]. Built by tests/compat/test_go_client.py.
package main

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

const (
	queue    = "go_q"
	rpcQueue = "go_rpc"
	replyTo  = "amq.rabbitmq.reply-to"
	timeout  = 15 * time.Second
)

var (
	problems   = []string{}
	problemsMu sync.Mutex // the responder goroutine checks too
)

func check(ok bool, format string, args ...interface{}) {
	if !ok {
		problemsMu.Lock()
		defer problemsMu.Unlock()
		problems = append(problems, fmt.Sprintf(format, args...))
	}
}

func must(err error, what string) {
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", what, err)
		os.Exit(2)
	}
}

// headers of message i: one of each field type; the Go type chosen fixes the wire type
// (int32 'I', int64 'l', float64 'd', time.Time 'T', []byte 'x', Decimal 'D', ...).
func headers(i int) amqp.Table {
	return amqp.Table{
		"i":     int32(i),
		"str":   "héllo ✓",
		"i64":   int64(1) << 40,
		"bool":  true,
		"dbl":   2.5,
		"table": amqp.Table{"k": "v", "n": int32(7)},
		"array": []interface{}{int32(1), "two", false},
		"ts":    time.Unix(1700000000, 0),
		"bytes": []byte{0, 1, 0xff},
		"dec":   amqp.Decimal{Scale: 2, Value: 12345},
	}
}

// sameHeaders compares values and Go types (so wire types); timestamps by instant, since the
// client decodes them in the local zone.
func sameHeaders(got, want amqp.Table) bool {
	if len(got) != len(want) {
		return false
	}
	for k, w := range want {
		if wt, ok := w.(time.Time); ok {
			gt, ok := got[k].(time.Time)
			if !ok || !gt.Equal(wt) {
				return false
			}
		} else if !reflect.DeepEqual(got[k], w) {
			return false
		}
	}
	return true
}

// normalize turns header values into the JSON form every language's program prints.
func normalize(v interface{}) interface{} {
	switch v := v.(type) {
	case amqp.Table:
		out := map[string]interface{}{}
		for k, x := range v {
			out[k] = normalize(x)
		}
		return out
	case []interface{}:
		out := []interface{}{}
		for _, x := range v {
			out = append(out, normalize(x))
		}
		return out
	case time.Time:
		return v.Unix()
	case []byte:
		return hex.EncodeToString(v)
	case amqp.Decimal:
		s := strconv.Itoa(int(v.Value)) // "12345", scale 2 -> "123.45"
		return s[:len(s)-int(v.Scale)] + "." + s[len(s)-int(v.Scale):]
	}
	return v
}

func main() {
	url := os.Args[1]
	n := 20
	if len(os.Args) > 2 {
		n, _ = strconv.Atoi(os.Args[2])
	}
	conn, err := amqp.Dial(url)
	must(err, "dial")
	defer conn.Close()
	ch, err := conn.Channel()
	must(err, "channel")
	_, err = ch.QueueDeclare(queue, true, false, false, false, nil)
	must(err, "queue.declare")

	// Publish with confirms and wait for every one.
	must(ch.Confirm(false), "confirm.select")
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, n))
	for i := 0; i < n; i++ {
		must(ch.Publish("", queue, false, false, amqp.Publishing{
			ContentType:  "text/plain",
			DeliveryMode: amqp.Persistent,
			Headers:      headers(i),
			Body:         []byte(fmt.Sprintf("m%d", i)),
		}), "publish")
	}
	confirmed := 0
	for confirmed < n {
		select {
		case c := <-confirms:
			check(c.Ack, "message with tag %d was nacked", c.DeliveryTag)
			check(c.DeliveryTag == uint64(confirmed+1), "confirm tag %d out of order", c.DeliveryTag)
			confirmed++
		case <-time.After(timeout):
			must(fmt.Errorf("%d of %d confirmed", confirmed, n), "confirms")
		}
	}

	// Consume with manual acks and a prefetch smaller than N, checking each message.
	must(ch.Qos(5, 0, false), "basic.qos")
	deliveries, err := ch.Consume(queue, "go-consumer", false, false, false, false, nil)
	must(err, "basic.consume")
	received := []string{}
	var first amqp.Delivery
	for len(received) < n {
		select {
		case d := <-deliveries:
			i := len(received)
			if i == 0 {
				first = d
			}
			received = append(received, string(d.Body))
			check(string(d.Body) == fmt.Sprintf("m%d", i), "message %d has body %q", i, d.Body)
			check(d.ContentType == "text/plain", "message %d content-type %q", i, d.ContentType)
			check(d.DeliveryMode == 2, "message %d delivery-mode %d", i, d.DeliveryMode)
			check(!d.Redelivered, "message %d redelivered", i)
			check(sameHeaders(d.Headers, headers(i)), "message %d headers %#v", i, d.Headers)
			must(d.Ack(false), "basic.ack")
		case <-time.After(timeout):
			must(fmt.Errorf("%d of %d received", len(received), n), "consume")
		}
	}
	must(ch.Cancel("go-consumer", false), "basic.cancel")
	declared, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	must(err, "passive queue.declare")

	rpc := requestReply(conn)

	firstHeaders := normalize(first.Headers).(map[string]interface{})
	delete(firstHeaders, "i")
	problemsMu.Lock() // the responder goroutine may still be acking its last request
	defer problemsMu.Unlock()
	out, _ := json.Marshal(map[string]interface{}{
		"lang": "go", "confirmed": confirmed, "received": received, "headers": firstHeaders,
		"content_type": first.ContentType, "delivery_mode": first.DeliveryMode,
		"remaining": declared.Messages, "rpc": rpc, "problems": problems,
	})
	fmt.Println(string(out))
	if len(problems) > 0 {
		os.Exit(1)
	}
}

// requestReply: a responder channel answers requests from rpcQueue; a requester channel
// consumes the direct reply-to pseudo-queue (no-ack, as RabbitMQ requires) and sends 3 requests.
// Returns correlation id -> reply body.
func requestReply(conn *amqp.Connection) map[string]string {
	server, err := conn.Channel()
	must(err, "responder channel")
	_, err = server.QueueDeclare(rpcQueue, false, false, false, false, nil)
	must(err, "rpc queue.declare")
	requests, err := server.Consume(rpcQueue, "", false, false, false, false, nil)
	must(err, "rpc basic.consume")
	go func() {
		for req := range requests {
			check(strings.HasPrefix(req.ReplyTo, replyTo+"."), "reply-to not rewritten: %q", req.ReplyTo)
			must(server.Publish("", req.ReplyTo, false, false, amqp.Publishing{
				CorrelationId: req.CorrelationId,
				Body:          append([]byte("reply:"), req.Body...),
			}), "reply publish")
			must(req.Ack(false), "rpc basic.ack")
		}
	}()

	client, err := conn.Channel()
	must(err, "requester channel")
	replies, err := client.Consume(replyTo, "", true, false, false, false, nil)
	must(err, "consume amq.rabbitmq.reply-to")
	for k := 0; k < 3; k++ {
		must(client.Publish("", rpcQueue, false, false, amqp.Publishing{
			ReplyTo:       replyTo,
			CorrelationId: fmt.Sprintf("c%d", k),
			Body:          []byte(fmt.Sprintf("req%d", k)),
		}), "request publish")
	}
	got := map[string]string{}
	for len(got) < 3 {
		select {
		case r := <-replies:
			got[r.CorrelationId] = string(r.Body)
		case <-time.After(timeout):
			check(false, "only %d of 3 replies", len(got))
			return got
		}
	}
	return got
}
