// Random message properties from the Go client (Debian's amqp091-go) through mqgw and back:
// timestamps anywhere in int64 seconds (a time before 1970 goes out as a huge unsigned value,
// as amqp091-go writes it), in the timestamp property and in headers, with the other
// properties random too. Prints one JSON line; exits 0 only if every message came back with
// exactly what was sent. Usage: props URL N SEED. Built by tests/compat/test_timestamps.py.
package main

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

const queue = "go_props"

func randomTime(r *rand.Rand) time.Time {
	switch r.Intn(4) {
	case 0:
		return time.Unix(-r.Int63n(1<<40), 0) // before 1970
	case 1:
		return time.Unix(r.Int63(), 0) // far beyond year 9999
	case 2:
		return time.Unix(-r.Int63(), 0)
	}
	return time.Unix(r.Int63n(4102444800), 0) // 1970 to 2100
}

func randomText(r *rand.Rand, prefix string) string {
	return prefix + strconv.FormatInt(r.Int63n(1<<30), 36)
}

func publishing(r *rand.Rand, i int) amqp.Publishing {
	p := amqp.Publishing{
		DeliveryMode: uint8(1 + r.Intn(2)),
		Priority:     uint8(r.Intn(10)),
		Timestamp:    randomTime(r),
		Headers: amqp.Table{
			"when":  randomTime(r),
			"n":     int64(i),
			"inner": amqp.Table{"at": randomTime(r)},
		},
		Body: []byte(fmt.Sprintf("p%d", i)),
	}
	if r.Intn(2) == 0 {
		p.ContentType = randomText(r, "type/")
	}
	if r.Intn(2) == 0 {
		p.ContentEncoding = randomText(r, "enc-")
	}
	if r.Intn(2) == 0 {
		p.CorrelationId = randomText(r, "corr-")
	}
	if r.Intn(2) == 0 {
		p.ReplyTo = randomText(r, "reply-")
	}
	if r.Intn(2) == 0 {
		p.MessageId = randomText(r, "id-")
	}
	if r.Intn(2) == 0 {
		p.Type = randomText(r, "kind-")
	}
	if r.Intn(2) == 0 {
		p.AppId = randomText(r, "app-")
	}
	if r.Intn(2) == 0 {
		p.UserId = "guest" // only the connection's own user is allowed
	}
	return p
}

func main() {
	url := os.Args[1]
	n, _ := strconv.Atoi(os.Args[2])
	seed, _ := strconv.ParseInt(os.Args[3], 10, 64)
	problems := []string{}
	fail := func(format string, args ...interface{}) {
		problems = append(problems, fmt.Sprintf(format, args...))
	}
	conn, err := amqp.Dial(url)
	if err != nil {
		fmt.Println(`{"problems": ["dial failed"]}`)
		os.Exit(1)
	}
	defer conn.Close()
	ch, _ := conn.Channel()
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		fail("queue.declare: %v", err)
	}
	_ = ch.Confirm(false)
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, n))
	r := rand.New(rand.NewSource(seed))
	sent := make([]amqp.Publishing, n)
	for i := 0; i < n; i++ {
		sent[i] = publishing(r, i)
		if err := ch.Publish("", queue, false, false, sent[i]); err != nil {
			fail("publish %d: %v", i, err)
		}
	}
	acked := 0
	for i := 0; i < n; i++ {
		select {
		case c := <-confirms:
			if c.Ack {
				acked++
			}
		case <-time.After(15 * time.Second):
			fail("confirms timed out")
			i = n
		}
	}
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		fail("consume: %v", err)
	}
	received := 0
	for received < n && len(problems) < 20 {
		select {
		case d := <-deliveries:
			want := sent[received]
			received++
			_ = d.Ack(false)
			if string(d.Body) != string(want.Body) {
				fail("got %q, expected %q", d.Body, want.Body)
				continue
			}
			if d.Timestamp.Unix() != want.Timestamp.Unix() {
				fail("%s timestamp %d, sent %d", d.Body, d.Timestamp.Unix(), want.Timestamp.Unix())
			}
			when, _ := d.Headers["when"].(time.Time)
			if when.Unix() != want.Headers["when"].(time.Time).Unix() {
				fail("%s header when %d, sent %d", d.Body, when.Unix(), want.Headers["when"].(time.Time).Unix())
			}
			inner, _ := d.Headers["inner"].(amqp.Table)
			at, _ := inner["at"].(time.Time)
			if at.Unix() != want.Headers["inner"].(amqp.Table)["at"].(time.Time).Unix() {
				fail("%s nested header at %d differs", d.Body, at.Unix())
			}
			if d.ContentType != want.ContentType || d.ContentEncoding != want.ContentEncoding ||
				d.CorrelationId != want.CorrelationId || d.ReplyTo != want.ReplyTo ||
				d.MessageId != want.MessageId || d.Type != want.Type || d.AppId != want.AppId ||
				d.UserId != want.UserId || d.Priority != want.Priority ||
				d.DeliveryMode != want.DeliveryMode {
				fail("%s properties differ: %+v", d.Body, d)
			}
		case <-time.After(15 * time.Second):
			fail("deliveries timed out after %d", received)
			received = n
		}
	}
	out, _ := json.Marshal(map[string]interface{}{
		"problems": problems, "confirmed": acked, "received": received,
	})
	fmt.Println(string(out))
	if len(problems) > 0 {
		os.Exit(1)
	}
}
