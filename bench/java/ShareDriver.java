// bench.peers' Kafka share-group peer: a producer and a share consumer driven line by line over stdin/stdout.
//
//   java -cp KAFKA_CLIENTS_CLASSPATH:. ShareDriver BOOTSTRAP TOPIC GROUP BODY_BYTES
//
// Requests, one per line, each answered "ok" (or "error <text>") once done:
//   produce          one record, acks=all, waited for
//   produce-many N   N records sent together, then waited for
//   receive N        poll until records come, hand out up to N of them: answered "ok K", K their number
//   ack              acknowledge (ACCEPT) every record handed out, then commitSync
// In explicit acknowledgement mode a share consumer polls again only once every record of its last poll is
// acknowledged: records beyond the N asked for are released at once (RELEASE), and a caller handed fewer than it
// wants acks those before it asks again.
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Random;
import java.util.concurrent.Future;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.consumer.AcknowledgeType;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public final class ShareDriver {
    private static final Duration POLL = Duration.ofMillis(100);
    private static final long RECEIVE_WAIT_MS = 10_000;

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], topic = args[1], group = args[2];
        byte[] body = new byte[Integer.parseInt(args[3])];
        new Random(20_240_601).nextBytes(body);
        PrintStream out = new PrintStream(System.out, true);

        Properties admin = new Properties();
        admin.put("bootstrap.servers", bootstrap);
        try (Admin client = Admin.create(admin)) {
            ConfigResource resource = new ConfigResource(ConfigResource.Type.GROUP, group);
            Collection<AlterConfigOp> reset = List.of(
                new AlterConfigOp(new ConfigEntry("share.auto.offset.reset", "earliest"), AlterConfigOp.OpType.SET));
            client.incrementalAlterConfigs(Map.of(resource, reset)).all().get();
        }
        Properties producing = new Properties();
        producing.put("bootstrap.servers", bootstrap);
        producing.put("acks", "all");
        producing.put("linger.ms", "0");
        Properties sharing = new Properties();
        sharing.put("bootstrap.servers", bootstrap);
        sharing.put("group.id", group);
        sharing.put("share.acknowledgement.mode", "explicit");
        try (KafkaProducer<byte[], byte[]> producer =
                 new KafkaProducer<>(producing, new ByteArraySerializer(), new ByteArraySerializer());
             KafkaShareConsumer<byte[], byte[]> consumer =
                 new KafkaShareConsumer<>(sharing, new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
            consumer.subscribe(List.of(topic));
            List<ConsumerRecord<byte[], byte[]>> handed = new ArrayList<>();
            BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
            out.println("ready");
            for (String line; (line = in.readLine()) != null; ) {
                String[] words = line.trim().split(" ");
                try {
                    switch (words[0]) {
                        case "produce" -> producer.send(new ProducerRecord<>(topic, body)).get();
                        case "produce-many" -> {
                            List<Future<RecordMetadata>> sent = new ArrayList<>();
                            for (int i = 0; i < Integer.parseInt(words[1]); i++) {
                                sent.add(producer.send(new ProducerRecord<>(topic, body)));
                            }
                            for (Future<RecordMetadata> each : sent) {
                                each.get();
                            }
                        }
                        case "receive" -> {
                            if (!handed.isEmpty()) {
                                throw new IllegalStateException(handed.size() + " records handed out are not acked");
                            }
                            int count = Integer.parseInt(words[1]);
                            long deadline = System.currentTimeMillis() + RECEIVE_WAIT_MS;
                            List<ConsumerRecord<byte[], byte[]>> polled = new ArrayList<>();
                            while (polled.isEmpty() && System.currentTimeMillis() < deadline) {
                                consumer.poll(POLL).forEach(polled::add);
                            }
                            for (ConsumerRecord<byte[], byte[]> record : polled) {
                                if (handed.size() < count) {
                                    handed.add(record);
                                } else {
                                    consumer.acknowledge(record, AcknowledgeType.RELEASE);
                                }
                            }
                            out.println("ok " + handed.size());
                            continue;
                        }
                        case "ack" -> {
                            for (ConsumerRecord<byte[], byte[]> record : handed) {
                                consumer.acknowledge(record, AcknowledgeType.ACCEPT);
                            }
                            handed.clear();
                            consumer.commitSync();
                        }
                        default -> throw new IllegalArgumentException("unknown request " + words[0]);
                    }
                    out.println("ok");
                } catch (Exception e) {
                    out.println("error " + e.toString().replace('\n', ' '));
                }
            }
        }
    }
}
