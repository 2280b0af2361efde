<?php
// The PHP client (Debian's php-amqplib) against mqgw: publish with confirms, consume with
// manual acks, request-reply over amq.rabbitmq.reply-to. Prints one JSON line; exits 0 only if
// every check passed. Usage: php client.php URL [N]. Run by tests/compat/test_php_client.py.

require '/usr/share/php/PhpAmqpLib/autoload.php';

use PhpAmqpLib\Connection\AMQPStreamConnection;
use PhpAmqpLib\Message\AMQPMessage;
use PhpAmqpLib\Wire\AMQPAbstractCollection;
use PhpAmqpLib\Wire\AMQPArray;
use PhpAmqpLib\Wire\AMQPDecimal;
use PhpAmqpLib\Wire\AMQPTable;

const QUEUE = 'php_q';
const RPC_QUEUE = 'php_rpc';
const REPLY_TO = 'amq.rabbitmq.reply-to';
const TIMEOUT = 15;

$problems = [];
function check(bool $ok, string $problem): void
{
    global $problems;
    if (!$ok) {
        $problems[] = $problem;
    }
}

// Headers of message $i: one field of each type, wire types given explicitly. No double:
// php-amqplib 3.5's writer has no case for T_DOUBLE/T_FLOAT (it reads them, cannot send them).
function headers(int $i): AMQPTable
{
    $t = new AMQPTable();
    $t->set('i', $i, AMQPTable::T_INT_LONG);
    $t->set('str', 'héllo ✓', AMQPTable::T_STRING_LONG);
    $t->set('i64', 1 << 40, AMQPTable::T_INT_LONGLONG);
    $t->set('bool', true, AMQPTable::T_BOOL);
    $t->set('table', new AMQPTable(['k' => 'v', 'n' => 7]), AMQPTable::T_TABLE);
    $t->set('array', new AMQPArray([1, 'two', false]), AMQPTable::T_ARRAY);
    $t->set('ts', 1700000000, AMQPTable::T_TIMESTAMP);
    $t->set('bytes', "\x00\x01\xff", AMQPTable::T_BYTES);
    $t->set('dec', new AMQPDecimal(12345, 2), AMQPTable::T_DECIMAL);
    return $t;
}

// A collection as [type, value] pairs all the way down, so that comparing two of them compares
// wire types as well as values. Iterating an AMQPTable/AMQPArray yields those pairs.
function typed(AMQPAbstractCollection $c): array
{
    $out = [];
    foreach ($c as $key => [$type, $value]) {
        $out[$key] = [$type, $value instanceof AMQPAbstractCollection ? typed($value) : $value];
    }
    return $out;
}

// The JSON form every language's program prints: timestamps as seconds, bytes as hex,
// decimals as text.
function normalize(AMQPAbstractCollection $c): array
{
    $out = [];
    foreach ($c as $key => [$type, $value]) {
        $out[$key] = match (true) {
            $value instanceof AMQPAbstractCollection => normalize($value),
            $value instanceof AMQPDecimal => substr((string) $value->getN(), 0, -$value->getE())
                . '.' . substr((string) $value->getN(), -$value->getE()),
            $type === AMQPTable::T_BYTES => bin2hex($value),
            $type === AMQPTable::T_BOOL => (bool) $value, // read back as an int
            default => $value,
        };
    }
    return $out;
}

[$url, $n] = [$argv[1], (int) ($argv[2] ?? 20)];
$u = parse_url($url);
$conn = new AMQPStreamConnection(
    $u['host'],
    $u['port'],
    urldecode($u['user']),
    urldecode($u['pass']),
    urldecode(substr($u['path'] ?? '/', 1)) ?: '/',
);
$ch = $conn->channel();
$ch->queue_declare(QUEUE, false, true, false, false);

// Publish with confirms and wait for every one.
$ch->confirm_select();
$confirmed = 0;
$ch->set_ack_handler(function (AMQPMessage $m) use (&$confirmed) {
    $confirmed++;
});
$ch->set_nack_handler(function (AMQPMessage $m) {
    check(false, 'nacked: ' . $m->getBody());
});
for ($i = 0; $i < $n; $i++) {
    $ch->basic_publish(new AMQPMessage("m$i", [
        'content_type' => 'text/plain',
        'delivery_mode' => AMQPMessage::DELIVERY_MODE_PERSISTENT,
        'application_headers' => headers($i),
    ]), '', QUEUE);
}
$ch->wait_for_pending_acks(TIMEOUT);

// Consume with manual acks and a prefetch smaller than N, checking each message.
$ch->basic_qos(0, 5, false);
$received = [];
$first = null;
$ch->basic_consume(QUEUE, 'php-consumer', false, false, false, false,
    function (AMQPMessage $m) use (&$received, &$first) {
        $i = count($received);
        $first ??= $m;
        $received[] = $m->getBody();
        check($m->getBody() === "m$i", "message $i body {$m->getBody()}");
        check($m->get('content_type') === 'text/plain', "message $i content-type");
        check($m->get('delivery_mode') === 2, "message $i delivery-mode");
        check(!$m->isRedelivered(), "message $i redelivered");
        check(
            typed($m->get('application_headers')) == typed(headers($i)),
            "message $i headers " . json_encode(typed($m->get('application_headers')),
                JSON_INVALID_UTF8_SUBSTITUTE),
        );
        $m->ack();
    });
while (count($received) < $n) {
    $ch->wait(null, false, TIMEOUT);
}
$ch->basic_cancel('php-consumer');
[, $remaining] = $ch->queue_declare(QUEUE, true, true, false, false);

// Request-reply: a responder channel answers requests from RPC_QUEUE; a requester channel
// consumes the direct reply-to pseudo-queue (no-ack, as RabbitMQ requires) and sends 3
// requests. One connection: each channel's wait() buffers the other channel's frames.
$server = $conn->channel();
$server->queue_declare(RPC_QUEUE, false, false, false, false);
$answered = 0;
$server->basic_consume(RPC_QUEUE, '', false, false, false, false,
    function (AMQPMessage $req) use ($server, &$answered) {
        $replyTo = $req->get('reply_to');
        check(str_starts_with($replyTo, REPLY_TO . '.'), "reply-to not rewritten: $replyTo");
        $reply = new AMQPMessage('reply:' . $req->getBody(),
            ['correlation_id' => $req->get('correlation_id')]);
        $server->basic_publish($reply, '', $replyTo);
        $req->ack();
        $answered++;
    });
$client = $conn->channel();
$rpc = [];
$client->basic_consume(REPLY_TO, '', false, true, false, false,
    function (AMQPMessage $m) use (&$rpc) {
        $rpc[$m->get('correlation_id')] = $m->getBody();
    });
for ($k = 0; $k < 3; $k++) {
    $client->basic_publish(new AMQPMessage("req$k",
        ['reply_to' => REPLY_TO, 'correlation_id' => "c$k"]), '', RPC_QUEUE);
}
while ($answered < 3) {
    $server->wait(null, false, TIMEOUT);
}
while (count($rpc) < 3) {
    $client->wait(null, false, TIMEOUT);
}

$headers = normalize($first->get('application_headers'));
unset($headers['i']);
echo json_encode([
    'lang' => 'php',
    'confirmed' => $confirmed,
    'received' => $received,
    'headers' => $headers,
    'content_type' => $first->get('content_type'),
    'delivery_mode' => $first->get('delivery_mode'),
    'remaining' => $remaining,
    'rpc' => $rpc,
    'problems' => $problems,
], JSON_UNESCAPED_UNICODE | JSON_UNESCAPED_SLASHES), "\n";
$conn->close();
exit($problems ? 1 : 0);
