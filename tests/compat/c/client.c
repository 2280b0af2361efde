/* The C client (Debian's librabbitmq, rabbitmq-c) against mqgw: publish with confirms, consume
 * with manual acks, request-reply over amq.rabbitmq.reply-to. Prints one JSON line; exits 0
 * only if every check passed. Usage: client URL [N]. Built by tests/compat/test_c_client.py. */
#include <amqp.h>
#include <amqp_tcp_socket.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#define QUEUE "c_q"
#define RPC_QUEUE "c_rpc"
#define REPLY_TO "amq.rabbitmq.reply-to"
#define MAIN_CH 1
#define REQUESTER_CH 2 /* consumes the reply-to pseudo-queue and sends requests */
#define RESPONDER_CH 3 /* consumes RPC_QUEUE and answers */

static amqp_connection_state_t conn;
static char problems[8192] = "";
static int problem_count = 0;

static void check(int ok, const char *fmt, ...) {
  if (ok) return;
  char line[512];
  va_list args;
  va_start(args, fmt);
  vsnprintf(line, sizeof line, fmt, args);
  va_end(args);
  /* kept JSON-safe: messages never contain quotes or backslashes */
  size_t used = strlen(problems);
  snprintf(problems + used, sizeof problems - used, "%s\"%s\"", problem_count++ ? "," : "",
           line);
}

static void die(const char *what) {
  amqp_rpc_reply_t reply = amqp_get_rpc_reply(conn);
  fprintf(stderr, "%s failed: reply type %d, library error %s\n", what, reply.reply_type,
          amqp_error_string2(reply.library_error));
  if (reply.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
      reply.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
    amqp_channel_close_t *close = reply.reply.decoded;
    fprintf(stderr, "channel.close %d %.*s\n", close->reply_code, (int)close->reply_text.len,
            (char *)close->reply_text.bytes);
  }
  exit(2);
}

/* An RPC-style call returned NULL on failure: report the reply and stop. */
static void *need(void *result, const char *what) {
  if (!result) die(what);
  return result;
}

static amqp_bytes_t bytes_of(const char *s) { return amqp_cstring_bytes(s); }

static int same_bytes(amqp_bytes_t a, amqp_bytes_t b) {
  return a.len == b.len && (a.len == 0 || memcmp(a.bytes, b.bytes, a.len) == 0);
}

/* Headers of message i: one field of each type, with explicit wire kinds. The nested table,
 * array and entry storage is static: the caller uses it before the next call. */
static amqp_table_t headers(int i) {
  static amqp_table_entry_t nested[2], entries[10];
  static amqp_field_value_t items[3];
  static uint8_t raw[] = {0x00, 0x01, 0xff};
  nested[0].key = bytes_of("k");
  nested[0].value.kind = AMQP_FIELD_KIND_UTF8;
  nested[0].value.value.bytes = bytes_of("v");
  nested[1].key = bytes_of("n");
  nested[1].value.kind = AMQP_FIELD_KIND_I32;
  nested[1].value.value.i32 = 7;
  items[0].kind = AMQP_FIELD_KIND_I32;
  items[0].value.i32 = 1;
  items[1].kind = AMQP_FIELD_KIND_UTF8;
  items[1].value.bytes = bytes_of("two");
  items[2].kind = AMQP_FIELD_KIND_BOOLEAN;
  items[2].value.boolean = 0;
  amqp_table_entry_t e[10] = {
      {bytes_of("i"), {.kind = AMQP_FIELD_KIND_I32, .value.i32 = i}},
      {bytes_of("str"), {.kind = AMQP_FIELD_KIND_UTF8, .value.bytes = bytes_of("héllo ✓")}},
      {bytes_of("i64"), {.kind = AMQP_FIELD_KIND_I64, .value.i64 = 1LL << 40}},
      {bytes_of("bool"), {.kind = AMQP_FIELD_KIND_BOOLEAN, .value.boolean = 1}},
      {bytes_of("dbl"), {.kind = AMQP_FIELD_KIND_F64, .value.f64 = 2.5}},
      {bytes_of("table"), {.kind = AMQP_FIELD_KIND_TABLE, .value.table = {2, nested}}},
      {bytes_of("array"), {.kind = AMQP_FIELD_KIND_ARRAY, .value.array = {3, items}}},
      {bytes_of("ts"), {.kind = AMQP_FIELD_KIND_TIMESTAMP, .value.u64 = 1700000000}},
      {bytes_of("bytes"), {.kind = AMQP_FIELD_KIND_BYTES, .value.bytes = {3, raw}}},
      {bytes_of("dec"), {.kind = AMQP_FIELD_KIND_DECIMAL, .value.decimal = {2, 12345}}},
  };
  memcpy(entries, e, sizeof e);
  return (amqp_table_t){10, entries};
}

static int same_table(amqp_table_t a, amqp_table_t b);

/* Same wire kind and same value. */
static int same_value(amqp_field_value_t a, amqp_field_value_t b) {
  if (a.kind != b.kind) return 0;
  switch (a.kind) {
    case AMQP_FIELD_KIND_BOOLEAN: return !a.value.boolean == !b.value.boolean;
    case AMQP_FIELD_KIND_I32: return a.value.i32 == b.value.i32;
    case AMQP_FIELD_KIND_I64: return a.value.i64 == b.value.i64;
    case AMQP_FIELD_KIND_TIMESTAMP: return a.value.u64 == b.value.u64;
    case AMQP_FIELD_KIND_F64: return a.value.f64 == b.value.f64;
    case AMQP_FIELD_KIND_DECIMAL:
      return a.value.decimal.decimals == b.value.decimal.decimals &&
             a.value.decimal.value == b.value.decimal.value;
    case AMQP_FIELD_KIND_UTF8:
    case AMQP_FIELD_KIND_BYTES: return same_bytes(a.value.bytes, b.value.bytes);
    case AMQP_FIELD_KIND_TABLE: return same_table(a.value.table, b.value.table);
    case AMQP_FIELD_KIND_ARRAY:
      if (a.value.array.num_entries != b.value.array.num_entries) return 0;
      for (int k = 0; k < a.value.array.num_entries; k++)
        if (!same_value(a.value.array.entries[k], b.value.array.entries[k])) return 0;
      return 1;
    default: return 0; /* a kind this program never sends */
  }
}

static int same_table(amqp_table_t a, amqp_table_t b) {
  if (a.num_entries != b.num_entries) return 0;
  for (int k = 0; k < b.num_entries; k++) {
    amqp_table_entry_t *found = NULL;
    for (int m = 0; m < a.num_entries; m++)
      if (same_bytes(a.entries[m].key, b.entries[k].key)) found = &a.entries[m];
    if (!found || !same_value(found->value, b.entries[k].value)) return 0;
  }
  return 1;
}

/* JSON in the form every language's program prints: timestamps as seconds, bytes as hex,
 * decimals as text. Strings are printed raw (this program's own strings need no escaping). */
static void print_table(amqp_table_t t, const char *skip);

static void print_value(amqp_field_value_t v) {
  switch (v.kind) {
    case AMQP_FIELD_KIND_BOOLEAN: printf(v.value.boolean ? "true" : "false"); break;
    case AMQP_FIELD_KIND_I32: printf("%d", v.value.i32); break;
    case AMQP_FIELD_KIND_I64: printf("%lld", (long long)v.value.i64); break;
    case AMQP_FIELD_KIND_TIMESTAMP: printf("%llu", (unsigned long long)v.value.u64); break;
    case AMQP_FIELD_KIND_F64: printf("%.17g", v.value.f64); break;
    case AMQP_FIELD_KIND_DECIMAL: {
      char digits[16];
      int len = snprintf(digits, sizeof digits, "%u", v.value.decimal.value);
      int cut = len - v.value.decimal.decimals;
      printf("\"%.*s.%s\"", cut, digits, digits + cut);
      break;
    }
    case AMQP_FIELD_KIND_UTF8:
      printf("\"%.*s\"", (int)v.value.bytes.len, (char *)v.value.bytes.bytes);
      break;
    case AMQP_FIELD_KIND_BYTES:
      putchar('"');
      for (size_t k = 0; k < v.value.bytes.len; k++)
        printf("%02x", ((uint8_t *)v.value.bytes.bytes)[k]);
      putchar('"');
      break;
    case AMQP_FIELD_KIND_TABLE: print_table(v.value.table, NULL); break;
    case AMQP_FIELD_KIND_ARRAY:
      putchar('[');
      for (int k = 0; k < v.value.array.num_entries; k++) {
        if (k) putchar(',');
        print_value(v.value.array.entries[k]);
      }
      putchar(']');
      break;
    default: printf("\"kind %c\"", v.kind);
  }
}

static void print_table(amqp_table_t t, const char *skip) {
  int first = 1;
  putchar('{');
  for (int k = 0; k < t.num_entries; k++) {
    if (skip && same_bytes(t.entries[k].key, bytes_of(skip))) continue;
    printf("%s\"%.*s\":", first ? "" : ",", (int)t.entries[k].key.len,
           (char *)t.entries[k].key.bytes);
    print_value(t.entries[k].value);
    first = 0;
  }
  putchar('}');
}

/* Wait for a frame (15 s at most); any frame but a method one is unexpected here. */
static amqp_method_t next_method(void) {
  struct timeval timeout = {15, 0};
  amqp_frame_t frame;
  int status = amqp_simple_wait_frame_noblock(conn, &frame, &timeout);
  if (status != AMQP_STATUS_OK || frame.frame_type != AMQP_FRAME_METHOD) {
    fprintf(stderr, "waiting for a method frame: %s\n", amqp_error_string2(status));
    exit(2);
  }
  return frame.payload.method;
}

/* Next delivery on any channel (15 s at most). */
static void next_delivery(amqp_envelope_t *envelope) {
  struct timeval timeout = {15, 0};
  amqp_maybe_release_buffers(conn);
  amqp_rpc_reply_t reply = amqp_consume_message(conn, envelope, &timeout, 0);
  if (reply.reply_type != AMQP_RESPONSE_NORMAL) {
    fprintf(stderr, "consume: reply type %d, %s\n", reply.reply_type,
            amqp_error_string2(reply.library_error));
    exit(2);
  }
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  int n = argc > 2 ? atoi(argv[2]) : 20;
  struct amqp_connection_info info;
  if (amqp_parse_url(strdup(argv[1]), &info) != AMQP_STATUS_OK) return 2;
  conn = amqp_new_connection();
  amqp_socket_t *socket = amqp_tcp_socket_new(conn);
  if (amqp_socket_open(socket, info.host, info.port) != AMQP_STATUS_OK) die("socket open");
  if (amqp_login(conn, info.vhost, 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, info.user,
                 info.password).reply_type != AMQP_RESPONSE_NORMAL)
    die("login");
  for (amqp_channel_t ch = MAIN_CH; ch <= RESPONDER_CH; ch++)
    need(amqp_channel_open(conn, ch), "channel.open");
  need(amqp_queue_declare(conn, MAIN_CH, bytes_of(QUEUE), 0, 1, 0, 0, amqp_empty_table),
       "queue.declare");

  /* Publish with confirms, then read basic.ack frames until every tag is covered (the server
   * may confirm several at once with multiple=1). */
  need(amqp_confirm_select(conn, MAIN_CH), "confirm.select");
  for (int i = 0; i < n; i++) {
    char body[32];
    snprintf(body, sizeof body, "m%d", i);
    amqp_basic_properties_t props = {
        ._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG |
                  AMQP_BASIC_HEADERS_FLAG,
        .content_type = bytes_of("text/plain"),
        .delivery_mode = AMQP_DELIVERY_PERSISTENT,
        .headers = headers(i),
    };
    if (amqp_basic_publish(conn, MAIN_CH, amqp_empty_bytes, bytes_of(QUEUE), 0, 0, &props,
                           bytes_of(body)) != AMQP_STATUS_OK)
      die("basic.publish");
  }
  uint64_t confirmed = 0;
  while (confirmed < (uint64_t)n) {
    amqp_method_t method = next_method();
    if (method.id == AMQP_BASIC_ACK_METHOD) {
      amqp_basic_ack_t *ack = method.decoded;
      check(ack->multiple || ack->delivery_tag == confirmed + 1, "confirm tag %llu unexpected",
            (unsigned long long)ack->delivery_tag);
      confirmed = ack->delivery_tag;
    } else {
      check(0, "method 0x%08x while waiting for confirms", method.id);
      if (method.id != AMQP_BASIC_NACK_METHOD) break;
      confirmed = ((amqp_basic_nack_t *)method.decoded)->delivery_tag;
    }
  }

  /* Consume with manual acks and a prefetch smaller than N, checking each message. */
  need(amqp_basic_qos(conn, MAIN_CH, 0, 5, 0), "basic.qos");
  need(amqp_basic_consume(conn, MAIN_CH, bytes_of(QUEUE), bytes_of("c-consumer"), 0, 0, 0,
                          amqp_empty_table),
       "basic.consume");
  char received[64 * 1024] = "";
  amqp_envelope_t first;
  for (int i = 0; i < n; i++) {
    amqp_envelope_t env;
    next_delivery(&env);
    amqp_basic_properties_t *p = &env.message.properties;
    char want[32];
    snprintf(want, sizeof want, "m%d", i);
    size_t used = strlen(received);
    snprintf(received + used, sizeof received - used, "%s\"%.*s\"", i ? "," : "",
             (int)env.message.body.len, (char *)env.message.body.bytes);
    check(same_bytes(env.message.body, bytes_of(want)), "message %d body differs", i);
    check((p->_flags & AMQP_BASIC_CONTENT_TYPE_FLAG) &&
              same_bytes(p->content_type, bytes_of("text/plain")),
          "message %d content-type differs", i);
    check((p->_flags & AMQP_BASIC_DELIVERY_MODE_FLAG) && p->delivery_mode == 2,
          "message %d delivery-mode differs", i);
    check((p->_flags & AMQP_BASIC_HEADERS_FLAG) && same_table(p->headers, headers(i)),
          "message %d headers differ", i);
    check(!env.redelivered, "message %d redelivered", i);
    if (amqp_basic_ack(conn, MAIN_CH, env.delivery_tag, 0) != AMQP_STATUS_OK) die("basic.ack");
    if (i == 0)
      first = env; /* kept (not destroyed) to print its headers */
    else
      amqp_destroy_envelope(&env);
  }
  need(amqp_basic_cancel(conn, MAIN_CH, bytes_of("c-consumer")), "basic.cancel");
  amqp_queue_declare_ok_t *declared =
      need(amqp_queue_declare(conn, MAIN_CH, bytes_of(QUEUE), 1, 1, 0, 0, amqp_empty_table),
           "passive queue.declare");
  uint32_t remaining = declared->message_count;

  /* Request-reply: the requester consumes amq.rabbitmq.reply-to with no-ack (as RabbitMQ
   * requires) and sends 3 requests; the responder answers each on the same connection. */
  need(amqp_queue_declare(conn, RESPONDER_CH, bytes_of(RPC_QUEUE), 0, 0, 0, 0, amqp_empty_table),
       "rpc queue.declare");
  need(amqp_basic_consume(conn, RESPONDER_CH, bytes_of(RPC_QUEUE), amqp_empty_bytes, 0, 0, 0,
                          amqp_empty_table),
       "rpc basic.consume");
  need(amqp_basic_consume(conn, REQUESTER_CH, bytes_of(REPLY_TO), amqp_empty_bytes, 0, 1, 0,
                          amqp_empty_table),
       "consume amq.rabbitmq.reply-to");
  for (int k = 0; k < 3; k++) {
    char body[16], correlation[16];
    snprintf(body, sizeof body, "req%d", k);
    snprintf(correlation, sizeof correlation, "c%d", k);
    amqp_basic_properties_t props = {
        ._flags = AMQP_BASIC_REPLY_TO_FLAG | AMQP_BASIC_CORRELATION_ID_FLAG,
        .reply_to = bytes_of(REPLY_TO),
        .correlation_id = bytes_of(correlation),
    };
    if (amqp_basic_publish(conn, REQUESTER_CH, amqp_empty_bytes, bytes_of(RPC_QUEUE), 0, 0,
                           &props, bytes_of(body)) != AMQP_STATUS_OK)
      die("request publish");
  }
  char rpc[1024] = "";
  for (int replies = 0; replies < 3;) {
    amqp_envelope_t env;
    next_delivery(&env);
    amqp_basic_properties_t *p = &env.message.properties;
    if (env.channel == RESPONDER_CH) {
      check(p->reply_to.len > strlen(REPLY_TO) + 1 &&
                memcmp(p->reply_to.bytes, REPLY_TO ".", strlen(REPLY_TO) + 1) == 0,
            "reply-to not rewritten");
      char answer[64];
      snprintf(answer, sizeof answer, "reply:%.*s", (int)env.message.body.len,
               (char *)env.message.body.bytes);
      amqp_basic_properties_t reply_props = {._flags = AMQP_BASIC_CORRELATION_ID_FLAG,
                                             .correlation_id = p->correlation_id};
      if (amqp_basic_publish(conn, RESPONDER_CH, amqp_empty_bytes, p->reply_to, 0, 0,
                             &reply_props, bytes_of(answer)) != AMQP_STATUS_OK ||
          amqp_basic_ack(conn, RESPONDER_CH, env.delivery_tag, 0) != AMQP_STATUS_OK)
        die("reply");
    } else {
      size_t used = strlen(rpc);
      snprintf(rpc + used, sizeof rpc - used, "%s\"%.*s\":\"%.*s\"", replies ? "," : "",
               (int)p->correlation_id.len, (char *)p->correlation_id.bytes,
               (int)env.message.body.len, (char *)env.message.body.bytes);
      replies++;
    }
    amqp_destroy_envelope(&env);
  }

  amqp_basic_properties_t *p = &first.message.properties;
  printf("{\"lang\":\"c\",\"confirmed\":%llu,\"received\":[%s],\"headers\":",
         (unsigned long long)confirmed, received);
  print_table(p->headers, "i");
  printf(",\"content_type\":\"%.*s\",\"delivery_mode\":%d,\"remaining\":%u,\"rpc\":{%s},"
         "\"problems\":[%s]}\n",
         (int)p->content_type.len, (char *)p->content_type.bytes, p->delivery_mode, remaining,
         rpc, problems);
  amqp_destroy_envelope(&first);
  amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
  amqp_destroy_connection(conn);
  return problem_count ? 1 : 0;
}
