# The Ruby client (Debian's ruby-bunny) against mqgw: publish with confirms, consume with manual
# acks, request-reply over amq.rabbitmq.reply-to. Prints one JSON line; exits 0 only if every
# check passed. Usage: ruby client.rb URL [N]. Run by tests/compat/test_ruby_client.py.
require "bunny"
require "json"
require "timeout"

QUEUE = "ruby_q"
RPC_QUEUE = "ruby_rpc"
REPLY_TO = "amq.rabbitmq.reply-to"
TIMEOUT_S = 15

$problems = Queue.new # consumer callbacks run on bunny's worker threads

def check(ok, problem)
  $problems << problem unless ok
end

# Headers of message i, one field of each type bunny sends right: it picks the wire type from
# the Ruby class (Integer is always 'l', String always 'S': no 'I', no byte array). Two bugs of
# amq-protocol 2.3 (the same against RabbitMQ) shape this: a BigDecimal is encoded wrongly (no
# decimal here), and an array's last element is dropped on decoding when it is shorter than 4
# bytes (the array ends with a string).
def headers(i)
  {
    "i" => i,
    "str" => "héllo ✓",
    "i64" => 1 << 40,
    "bool" => true,
    "dbl" => 2.5,
    "table" => { "k" => "v", "n" => 7 },
    "array" => [false, 1, "two"],
    "ts" => Time.at(1_700_000_000),
  }
end

# The JSON form every language's program prints: timestamps as seconds. Header strings come
# back from bunny as binary (ASCII-8BIT) strings: read them as the UTF-8 they are.
def normalize(value)
  case value
  when Hash then value.transform_values { |v| normalize(v) }
  when Array then value.map { |v| normalize(v) }
  when Time then value.to_i
  when String then value.dup.force_encoding(Encoding::UTF_8)
  else value
  end
end

# Values paired with their Ruby class all the way down, so that comparing two of them compares
# types too (1 == 1.0 in Ruby).
def typed(value)
  case value
  when Hash then value.transform_values { |v| typed(v) }
  when Array then value.map { |v| typed(v) }
  else [value.class.name, normalize(value)]
  end
end

def take(queue, what)
  Timeout.timeout(TIMEOUT_S, RuntimeError, "timed out waiting for #{what}") { queue.pop }
end

url = ARGV[0]
n = (ARGV[1] || 20).to_i
conn = Bunny.new(url, logger: Logger.new(nil))
conn.start
ch = conn.create_channel
ch.queue(QUEUE, durable: true)

# Publish with confirms and wait for every one.
ch.confirm_select
n.times do |i|
  ch.default_exchange.publish("m#{i}", routing_key: QUEUE, content_type: "text/plain",
                                       persistent: true, headers: headers(i))
end
check(ch.wait_for_confirms, "nacked: #{ch.nacked_set.to_a}")
confirmed = n - ch.unconfirmed_set.size - ch.nacked_set.size

# Consume with manual acks and a prefetch smaller than N, checking each message.
ch.prefetch(5)
deliveries = Queue.new
consumer = ch.queue(QUEUE, durable: true).subscribe(manual_ack: true) do |info, props, body|
  deliveries << [info, props, body]
end
received = []
first = nil
n.times do |i|
  info, props, body = take(deliveries, "message #{i}")
  first ||= props
  received << body
  check(body == "m#{i}", "message #{i} body #{body}")
  check(props.content_type == "text/plain", "message #{i} content-type")
  check(props.delivery_mode == 2, "message #{i} delivery-mode")
  check(!info.redelivered?, "message #{i} redelivered")
  check(typed(props.headers) == typed(headers(i)), "message #{i} headers #{props.headers}")
  ch.ack(info.delivery_tag)
end
consumer.cancel
remaining = ch.queue_declare(QUEUE, passive: true).message_count

# Request-reply: a responder channel answers requests from RPC_QUEUE; a requester channel
# consumes the direct reply-to pseudo-queue (no-ack, as RabbitMQ requires) and sends 3 requests.
server = conn.create_channel
server.queue(RPC_QUEUE).subscribe(manual_ack: true) do |info, props, body|
  check(props.reply_to.start_with?("#{REPLY_TO}."), "reply-to not rewritten: #{props.reply_to}")
  server.default_exchange.publish("reply:#{body}", routing_key: props.reply_to,
                                                   correlation_id: props.correlation_id)
  server.ack(info.delivery_tag)
end
client = conn.create_channel
replies = Queue.new
reply_consumer = Bunny::Consumer.new(client, REPLY_TO, client.generate_consumer_tag, true)
reply_consumer.on_delivery { |_info, props, body| replies << [props.correlation_id, body] }
client.basic_consume_with(reply_consumer)
3.times do |k|
  client.default_exchange.publish("req#{k}", routing_key: RPC_QUEUE, reply_to: REPLY_TO,
                                             correlation_id: "c#{k}")
end
rpc = 3.times.to_h { |k| take(replies, "reply #{k}") }

problems = []
problems << $problems.pop until $problems.empty?
puts JSON.generate(
  lang: "ruby", confirmed: confirmed, received: received,
  headers: normalize(first.headers).except("i"), content_type: first.content_type,
  delivery_mode: first.delivery_mode, remaining: remaining, rpc: rpc, problems: problems
)
conn.close
exit(problems.empty? ? 0 : 1)
