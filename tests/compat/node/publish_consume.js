// Publishes N messages with confirms, consumes them with manual acks, prints one JSON line.
const amqp = require("amqplib");

async function main() {
  const [url, count] = [process.argv[2], Number(process.argv[3] || 20)];
  const conn = await amqp.connect(url);
  const channel = await conn.createConfirmChannel();
  await channel.assertQueue("node_q", { durable: true });
  for (let i = 0; i < count; i++) {
    channel.sendToQueue("node_q", Buffer.from(`n${i}`), { persistent: true, headers: { i } });
  }
  await channel.waitForConfirms();
  const received = [];
  await new Promise((resolve) => {
    channel.consume("node_q", (msg) => {
      received.push({ body: msg.content.toString(), i: msg.properties.headers.i });
      channel.ack(msg);
      if (received.length === count) resolve();
    });
  });
  const declared = await channel.checkQueue("node_q");
  console.log(JSON.stringify({ received, messageCount: declared.messageCount }));
  await conn.close();
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
