// The Java client (Debian's librabbitmq-client-java, amqp-client 5.0) against mqgw.
//   java Client URL basic [N]  publish with confirms, consume with manual acks, request-reply
//                              over amq.rabbitmq.reply-to; prints one JSON line
//   java Client URL recovery   consumes with automatic recovery on; prints a "ready" JSON line,
//                              waits for the gateway to be restarted and the connection
//                              recovered, publishes again, prints a "done" JSON line (with
//                              what a durable queue without consumer kept across the restart)
// Exits 0 only if every check passed. Compiled and run by tests/compat/test_java_client.py.

import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.ConfirmListener;
import com.rabbitmq.client.Connection;
import com.rabbitmq.client.ConnectionFactory;
import com.rabbitmq.client.Delivery;
import com.rabbitmq.client.GetResponse;
import com.rabbitmq.client.LongString;
import com.rabbitmq.client.Recoverable;
import com.rabbitmq.client.RecoveryListener;
import com.rabbitmq.client.impl.recovery.AutorecoveringConnection;
import java.math.BigDecimal;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Date;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.ConcurrentSkipListSet;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;

public class Client {
    static final String REPLY_TO = "amq.rabbitmq.reply-to";
    static final int TIMEOUT_S = 15;
    static final List<String> problems = new ArrayList<>();

    static synchronized void check(boolean ok, String problem) {
        if (!ok) problems.add(problem);
    }

    public static void main(String[] args) throws Exception {
        ConnectionFactory factory = new ConnectionFactory();
        factory.setUri(args[0]);
        if (args[1].equals("recovery")) {
            recovery(factory);
        } else {
            basic(factory, args.length > 2 ? Integer.parseInt(args[2]) : 20);
        }
        System.exit(problems.isEmpty() ? 0 : 1);
    }

    /** Headers of message i: one field of each type; the Java type fixes the wire type. */
    static Map<String, Object> headers(int i) {
        Map<String, Object> h = new LinkedHashMap<>();
        h.put("i", i); // Integer: 'I'
        h.put("str", "héllo ✓");
        h.put("i64", 1L << 40); // Long: 'l'
        h.put("bool", true);
        h.put("dbl", 2.5); // Double: 'd'
        h.put("table", Map.of("k", "v", "n", 7));
        h.put("array", List.of(1, "two", false));
        h.put("ts", new Date(1700000000_000L)); // 'T', whole seconds on the wire
        h.put("bytes", new byte[] {0, 1, (byte) 0xff}); // 'x'
        h.put("dec", new BigDecimal("123.45")); // 'D'
        return h;
    }

    /** Same value and same Java (so wire) type; strings come back as LongString. */
    static boolean same(Object got, Object want) {
        if (want instanceof String) return got instanceof LongString && got.toString().equals(want);
        if (want instanceof byte[]) {
            return got instanceof byte[] && Arrays.equals((byte[]) got, (byte[]) want);
        }
        if (want instanceof Map) {
            Map<?, ?> g = got instanceof Map ? (Map<?, ?>) got : Map.of();
            Map<?, ?> w = (Map<?, ?>) want;
            if (g.size() != w.size()) return false;
            for (Map.Entry<?, ?> e : w.entrySet()) {
                if (!same(g.get(e.getKey()), e.getValue())) return false;
            }
            return true;
        }
        if (want instanceof List) {
            List<?> g = got instanceof List ? (List<?>) got : List.of();
            List<?> w = (List<?>) want;
            if (g.size() != w.size()) return false;
            for (int k = 0; k < w.size(); k++) if (!same(g.get(k), w.get(k))) return false;
            return true;
        }
        return got != null && got.getClass() == want.getClass() && got.equals(want);
    }

    /** JSON in the form every language's program prints: timestamps as seconds, bytes as hex,
     * decimals as text. Enough JSON for this program's own values. */
    static String json(Object v) {
        if (v == null) return "null";
        if (v instanceof Map) {
            List<String> parts = new ArrayList<>();
            ((Map<?, ?>) v).forEach((k, x) -> parts.add(json(k.toString()) + ":" + json(x)));
            return "{" + String.join(",", parts) + "}";
        }
        if (v instanceof List) {
            List<String> parts = new ArrayList<>();
            for (Object x : (List<?>) v) parts.add(json(x));
            return "[" + String.join(",", parts) + "]";
        }
        if (v instanceof Date) return Long.toString(((Date) v).getTime() / 1000);
        if (v instanceof BigDecimal) return json(((BigDecimal) v).toPlainString());
        if (v instanceof byte[]) {
            StringBuilder hex = new StringBuilder();
            for (byte b : (byte[]) v) hex.append(String.format("%02x", b));
            return json(hex.toString());
        }
        if (v instanceof Number || v instanceof Boolean) return v.toString();
        // Strings: non-ASCII as JSON escapes, so the output does not depend on the locale.
        StringBuilder quoted = new StringBuilder("\"");
        for (char c : v.toString().toCharArray()) {
            if (c == '"' || c == '\\') quoted.append('\\').append(c);
            else if (c < 0x20 || c > 0x7e) quoted.append(String.format("\\u%04x", (int) c));
            else quoted.append(c);
        }
        return quoted.append('"').toString();
    }

    /** confirm.select plus a listener that tracks unconfirmed tags (multiple acks included). */
    static ConcurrentSkipListSet<Long> confirming(Channel ch) throws Exception {
        ConcurrentSkipListSet<Long> unconfirmed = new ConcurrentSkipListSet<>();
        ch.confirmSelect();
        ch.addConfirmListener(new ConfirmListener() {
            public void handleAck(long tag, boolean multiple) {
                if (multiple) unconfirmed.headSet(tag, true).clear();
                else unconfirmed.remove(tag);
            }

            public void handleNack(long tag, boolean multiple) {
                check(false, "nack for tag " + tag);
            }
        });
        return unconfirmed;
    }

    static String text(byte[] body) {
        return new String(body, StandardCharsets.UTF_8);
    }

    static Delivery take(BlockingQueue<Delivery> queue, String what) throws Exception {
        Delivery d = queue.poll(TIMEOUT_S, TimeUnit.SECONDS);
        if (d == null) throw new IllegalStateException("timed out waiting for " + what);
        return d;
    }

    static void basic(ConnectionFactory factory, int n) throws Exception {
        Connection conn = factory.newConnection();
        Channel ch = conn.createChannel();
        ch.queueDeclare("java_q", true, false, false, null);

        // Publish with confirms and wait for every one.
        ConcurrentSkipListSet<Long> unconfirmed = confirming(ch);
        AMQP.BasicProperties.Builder props =
                new AMQP.BasicProperties.Builder().contentType("text/plain").deliveryMode(2);
        for (int i = 0; i < n; i++) {
            unconfirmed.add(ch.getNextPublishSeqNo());
            ch.basicPublish("", "java_q", props.headers(headers(i)).build(), ("m" + i).getBytes());
        }
        ch.waitForConfirmsOrDie(TIMEOUT_S * 1000L);
        int confirmed = n - unconfirmed.size();

        // Consume with manual acks and a prefetch smaller than N, checking each message.
        ch.basicQos(5);
        BlockingQueue<Delivery> deliveries = new LinkedBlockingQueue<>();
        String tag = ch.basicConsume("java_q", false, (t, d) -> deliveries.add(d), t -> {});
        List<String> received = new ArrayList<>();
        Delivery first = null;
        for (int i = 0; i < n; i++) {
            Delivery d = take(deliveries, "message " + i);
            first = first == null ? d : first;
            AMQP.BasicProperties p = d.getProperties();
            received.add(text(d.getBody()));
            check(received.get(i).equals("m" + i), "message " + i + " body " + received.get(i));
            check("text/plain".equals(p.getContentType()), "message " + i + " content-type");
            check(Objects.equals(p.getDeliveryMode(), 2), "message " + i + " delivery-mode");
            check(!d.getEnvelope().isRedeliver(), "message " + i + " redelivered");
            check(same(p.getHeaders(), headers(i)), "message " + i + " headers " + p.getHeaders());
            ch.basicAck(d.getEnvelope().getDeliveryTag(), false);
        }
        ch.basicCancel(tag);
        int remaining = ch.queueDeclarePassive("java_q").getMessageCount();

        Map<String, String> rpc = requestReply(conn);

        Map<String, Object> firstHeaders = new LinkedHashMap<>(first.getProperties().getHeaders());
        firstHeaders.remove("i");
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("lang", "java");
        out.put("confirmed", confirmed);
        out.put("received", received);
        out.put("headers", firstHeaders);
        out.put("content_type", first.getProperties().getContentType());
        out.put("delivery_mode", first.getProperties().getDeliveryMode());
        out.put("remaining", remaining);
        out.put("rpc", rpc);
        out.put("problems", problems);
        System.out.println(json(out));
        conn.close();
    }

    /** A responder channel answers requests from java_rpc; a requester channel consumes the
     * direct reply-to pseudo-queue (no-ack, as RabbitMQ requires) and sends 3 requests.
     * Returns correlation id -> reply body. */
    static Map<String, String> requestReply(Connection conn) throws Exception {
        Channel server = conn.createChannel();
        server.queueDeclare("java_rpc", false, false, false, null);
        server.basicConsume("java_rpc", false, (t, req) -> {
            String replyTo = req.getProperties().getReplyTo();
            check(replyTo.startsWith(REPLY_TO + "."), "reply-to not rewritten: " + replyTo);
            AMQP.BasicProperties answer = new AMQP.BasicProperties.Builder()
                    .correlationId(req.getProperties().getCorrelationId()).build();
            byte[] body = ("reply:" + text(req.getBody())).getBytes();
            server.basicPublish("", replyTo, answer, body);
            server.basicAck(req.getEnvelope().getDeliveryTag(), false);
        }, t -> {});

        Channel client = conn.createChannel();
        BlockingQueue<Delivery> replies = new LinkedBlockingQueue<>();
        client.basicConsume(REPLY_TO, true, (t, d) -> replies.add(d), t -> {});
        for (int k = 0; k < 3; k++) {
            AMQP.BasicProperties request = new AMQP.BasicProperties.Builder()
                    .replyTo(REPLY_TO).correlationId("c" + k).build();
            client.basicPublish("", "java_rpc", request, ("req" + k).getBytes());
        }
        Map<String, String> got = new LinkedHashMap<>();
        for (int k = 0; k < 3; k++) {
            Delivery d = take(replies, "reply " + k);
            got.put(d.getProperties().getCorrelationId(), text(d.getBody()));
        }
        return got;
    }

    /** Topology to recover: a non-durable exchange and an exclusive server-named queue bound to
     * it (both gone after a gateway restart, so the client must re-declare them, the queue under
     * a new name) and a durable queue, a consumer on each; and a durable queue without one. */
    static void recovery(ConnectionFactory factory) throws Exception {
        factory.setAutomaticRecoveryEnabled(true);
        factory.setTopologyRecoveryEnabled(true);
        factory.setNetworkRecoveryInterval(250); // retry every 250 ms until the gateway is back
        AutorecoveringConnection conn = (AutorecoveringConnection) factory.newConnection();
        CountDownLatch recovered = new CountDownLatch(1);
        conn.addRecoveryListener(new RecoveryListener() {
            public void handleRecovery(Recoverable r) {
                recovered.countDown();
            }

            public void handleRecoveryStarted(Recoverable r) {}
        });
        Map<String, String> renamed = new LinkedHashMap<>();
        conn.addQueueRecoveryListener(renamed::put);

        Channel ch = conn.createChannel();
        ch.confirmSelect(); // waitForConfirmsOrDie below throws on a nack or a timeout
        ch.exchangeDeclare("java_rx", "direct", false);
        String exclusive = ch.queueDeclare().getQueue();
        ch.queueBind(exclusive, "java_rx", "k");
        ch.queueDeclare("java_durable_q", true, false, false, null);
        BlockingQueue<Delivery> viaExchange = new LinkedBlockingQueue<>();
        BlockingQueue<Delivery> viaDurable = new LinkedBlockingQueue<>();
        ch.basicConsume(exclusive, false, (t, d) -> {
            viaExchange.add(d);
            ch.basicAck(d.getEnvelope().getDeliveryTag(), false);
        }, t -> check(false, "exclusive-queue consumer cancelled"));
        ch.basicConsume("java_durable_q", false, (t, d) -> {
            viaDurable.add(d);
            ch.basicAck(d.getEnvelope().getDeliveryTag(), false);
        }, t -> check(false, "durable-queue consumer cancelled"));

        // Parked in a durable queue with no consumer across the restart: one transient, one
        // persistent message. RabbitMQ's classic queues recover only the persistent one.
        ch.queueDeclare("java_parked_q", true, false, false, null);
        for (int mode : List.of(1, 2)) {
            AMQP.BasicProperties props =
                    new AMQP.BasicProperties.Builder().deliveryMode(mode).build();
            byte[] body = (mode == 1 ? "transient" : "persistent").getBytes();
            ch.basicPublish("", "java_parked_q", props, body);
        }

        List<String> gotExchange = new ArrayList<>();
        List<String> gotDurable = new ArrayList<>();
        for (String phase : List.of("before", "after")) {
            if (phase.equals("after")) {
                Map<String, Object> ready = new LinkedHashMap<>();
                ready.put("phase", "ready");
                ready.put("queue", exclusive);
                System.out.println(json(ready)); // the test restarts the gateway now
                System.out.flush();
                if (!recovered.await(30, TimeUnit.SECONDS)) {
                    throw new IllegalStateException("connection not recovered within 30 s");
                }
            }
            ch.basicPublish("java_rx", "k", null, (phase + "-x").getBytes());
            ch.basicPublish("", "java_durable_q", null, (phase + "-q").getBytes());
            ch.waitForConfirmsOrDie(TIMEOUT_S * 1000L);
            gotExchange.add(text(take(viaExchange, phase + "-x").getBody()));
            gotDurable.add(text(take(viaDurable, phase + "-q").getBody()));
        }
        Thread.sleep(200); // nothing more (no duplicates) should arrive
        check(viaExchange.isEmpty() && viaDurable.isEmpty(), "unexpected extra deliveries");

        List<String> parked = new ArrayList<>();
        for (GetResponse r; (r = ch.basicGet("java_parked_q", true)) != null; ) {
            parked.add(text(r.getBody()));
        }

        Map<String, Object> out = new LinkedHashMap<>();
        out.put("phase", "done");
        out.put("via_exchange", gotExchange);
        out.put("via_durable", gotDurable);
        out.put("renamed", renamed);
        out.put("parked", parked);
        out.put("problems", problems);
        System.out.println(json(out));
        conn.close();
    }
}
