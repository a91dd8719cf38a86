package keyload.test;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.MessageDigest;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.UUID;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;
import org.apache.avro.AvroRuntimeException;
import org.apache.avro.Schema;
import org.apache.avro.SchemaNormalization;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.message.BinaryMessageDecoder;
import org.apache.avro.message.BinaryMessageEncoder;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.utils.Utils;

/**
 * A keyload client that knows nothing of keyload but its Avro schemas and its documented rules: it writes a
 * signed Enqueue straight to the command topic of a Kafka deployment and reads the outcome the processor
 * publishes for it.
 *
 * <ul>
 *   <li>The command is a {@code keyload.Command} in Avro single-object encoding ({@code C3 01}, the schema's
 *       CRC-64-AVRO fingerprint, the body); with access control on it is wrapped in a {@code keyload.Signed}
 *       {key_id, mac, record} whose mac is HMAC-SHA256 under the principal's secret over the Command's bytes.
 *   <li>keyload partitions by domain itself: partition = the first 8 bytes of SHA-256(UTF-8 domain), an unsigned
 *       big-endian integer, modulo the command topic's partition count. The record is produced to that partition
 *       explicitly; with {@code --default-partitioner} it is not, and Kafka's murmur2 partitioner picks one, to
 *       show that the processor refuses a record on another partition ({@code Validation}).
 *   <li>The outcome is published to outcome partition {@code reply_to}, sealed: a {@code keyload.Signed} around
 *       the single-object-encoded {@code keyload.Outcome}, MACed with the same key. It is trusted only once that
 *       MAC verifies.
 * </ul>
 *
 * <p>One deviation from the Avro specification: keyload's registry (keyload/log/codec.py {@code _fingerprint})
 * writes the 8 fingerprint bytes of the single-object header in big-endian order, where the specification, and
 * Avro's {@code BinaryMessageEncoder}/{@code BinaryMessageDecoder}, write them little-endian. Until keyload follows
 * the specification the program reverses those bytes after encoding and before decoding ({@link
 * #KEYLOAD_REVERSES_FINGERPRINT}); the test asserts that keyload still does so.
 *
 * <p>Arguments: BOOTSTRAP PREFIX COMMAND_PARTITIONS OUTCOME_PARTITIONS CREDENTIAL_FILE SCHEMA_FOLDER DOMAIN QUEUE
 * MESSAGE_ID BODY [--default-partitioner]. The schema folder holds keyload.Command.avsc, keyload.Outcome.avsc and
 * keyload.Signed.avsc with every named type inlined. Prints {@code outcome ID STATUS ERROR_CODE|- partition=P
 * offset=O} and exits 0 on committed (or, with --default-partitioner, on the expected refusal), 1 otherwise, 2 on
 * a usage or setup error.
 */
public final class KafkaProducerClient {
    private static final Duration OUTCOME_TIMEOUT = Duration.ofSeconds(60);
    private static final Duration POLL = Duration.ofMillis(200);
    private static final long SEND_TIMEOUT_S = 60;
    private static final String ENQUEUE = "keyload.command.Enqueue";
    private static final String DEFAULT_PARTITIONER = "--default-partitioner";
    /** Whether keyload's single-object headers hold the fingerprint big-endian (see the class comment). */
    static final boolean KEYLOAD_REVERSES_FINGERPRINT = true;
    private static final int MAGIC_BYTES = 2;
    private static final int HEADER_BYTES = MAGIC_BYTES + 8;

    private KafkaProducerClient() {}

    /** A principal's credential file: {"format": 1, "principal", "key_id", "secret": base64}. */
    record Credential(String principal, String keyId, byte[] secret) {
        static Credential load(Path path) throws IOException {
            JsonNode json = new ObjectMapper().readTree(path.toFile());
            if (json == null || json.path("format").asInt(-1) != 1) {
                throw new IOException(path + " is not a format 1 credential");
            }
            return new Credential(
                    json.path("principal").asText(),
                    json.path("key_id").asText(),
                    Base64.getDecoder().decode(json.path("secret").asText()));
        }

        byte[] mac(byte[] record) {
            try {
                Mac hmac = Mac.getInstance("HmacSHA256");
                hmac.init(new SecretKeySpec(secret, "HmacSHA256"));
                return hmac.doFinal(record);
            } catch (GeneralSecurityException e) {
                throw new IllegalStateException("HMAC-SHA256 is unavailable", e);
            }
        }

        boolean verifies(byte[] record, byte[] mac) {
            return MessageDigest.isEqual(mac(record), mac);
        }
    }

    /** keyload's one domain→partition function (keyload/log/base.py partition_for). */
    static int partitionFor(String domain, int partitions) {
        try {
            byte[] digest = MessageDigest.getInstance("SHA-256").digest(domain.getBytes(StandardCharsets.UTF_8));
            long first = ByteBuffer.wrap(digest, 0, 8).getLong(); // big-endian; unsigned below
            return (int) Long.remainderUnsigned(first, partitions);
        } catch (GeneralSecurityException e) {
            throw new IllegalStateException("SHA-256 is unavailable", e);
        }
    }

    /** The partition Kafka's default partitioner gives a keyed record (BuiltInPartitioner.partitionForKey). */
    static int murmur2Partition(byte[] key, int partitions) {
        return Utils.toPositive(Utils.murmur2(key)) % partitions;
    }

    /** The 8 fingerprint bytes of a single-object header: CRC-64-AVRO of the parsing canonical form, in `order`. */
    static String fingerprintHex(Schema schema, ByteOrder order) {
        long fingerprint = SchemaNormalization.parsingFingerprint64(schema);
        return HexFormat.of().formatHex(ByteBuffer.allocate(8).order(order).putLong(fingerprint).array());
    }

    /**
     * A single-object encoding with its fingerprint's bytes reversed: Avro's form (little-endian) to keyload's, and
     * back. Unchanged once keyload follows the specification.
     */
    static byte[] keyloadHeader(byte[] encoded) {
        if (!KEYLOAD_REVERSES_FINGERPRINT || encoded.length < HEADER_BYTES) {
            return encoded;
        }
        byte[] out = encoded.clone();
        for (int i = 0; i < 8; i++) {
            out[MAGIC_BYTES + i] = encoded[HEADER_BYTES - 1 - i];
        }
        return out;
    }

    static Schema schema(Path folder, String name) throws IOException {
        // One parser per file: each file is self-contained, and a parser refuses a second definition of a name.
        return new Schema.Parser().parse(folder.resolve(name + ".avsc").toFile());
    }

    static Schema branch(Schema union, String fullName) {
        for (Schema type : union.getTypes()) {
            if (type.getType() == Schema.Type.RECORD && type.getFullName().equals(fullName)) {
                return type;
            }
        }
        throw new IllegalArgumentException("the union has no branch " + fullName);
    }

    static byte[] bytes(ByteBuffer buffer) {
        byte[] out = new byte[buffer.remaining()];
        buffer.duplicate().get(out);
        return out;
    }

    static String text(Object value) {
        return value == null ? "-" : value.toString();
    }

    public static void main(String[] argv) {
        boolean defaultPartitioner = false;
        List<String> args = new ArrayList<>();
        for (String arg : argv) {
            if (arg.equals(DEFAULT_PARTITIONER)) {
                defaultPartitioner = true;
            } else {
                args.add(arg);
            }
        }
        if (args.size() != 10) {
            System.err.println("usage: BOOTSTRAP PREFIX COMMAND_PARTITIONS OUTCOME_PARTITIONS CREDENTIAL_FILE"
                    + " SCHEMA_FOLDER DOMAIN QUEUE MESSAGE_ID BODY [" + DEFAULT_PARTITIONER + "]");
            System.exit(2);
        }
        int code;
        try {
            code = run(args, defaultPartitioner);
        } catch (Exception e) {
            System.err.println("error: " + e);
            e.printStackTrace();
            code = 2;
        }
        System.out.flush();
        System.exit(code);
    }

    static int run(List<String> args, boolean defaultPartitioner) throws Exception {
        String bootstrap = args.get(0);
        String prefix = args.get(1);
        int commandPartitions = Integer.parseInt(args.get(2));
        int outcomePartitions = Integer.parseInt(args.get(3));
        Credential credential = Credential.load(Path.of(args.get(4)));
        Path schemas = Path.of(args.get(5));
        String domain = args.get(6);
        String queue = args.get(7);
        String messageId = args.get(8);
        byte[] body = args.get(9).getBytes(StandardCharsets.UTF_8);
        String commandsTopic = prefix + ".commands";
        String outcomesTopic = prefix + ".outcomes";

        Schema commandSchema = schema(schemas, "keyload.Command");
        Schema outcomeSchema = schema(schemas, "keyload.Outcome");
        Schema signedSchema = schema(schemas, "keyload.Signed");
        ByteOrder headerOrder = KEYLOAD_REVERSES_FINGERPRINT ? ByteOrder.BIG_ENDIAN : ByteOrder.LITTLE_ENDIAN;
        for (Schema s : List.of(commandSchema, outcomeSchema, signedSchema)) {
            System.out.println("fingerprint " + s.getFullName() + " " + fingerprintHex(s, headerOrder)
                    + " avro=" + fingerprintHex(s, ByteOrder.LITTLE_ENDIAN));
        }

        // The command: an Enqueue in the keyload.Command envelope, single-object encoded, then signed.
        String commandId = "java-" + UUID.randomUUID();
        int replyTo = ThreadLocalRandom.current().nextInt(outcomePartitions);
        Schema enqueueSchema = branch(commandSchema.getField("body").schema(), ENQUEUE);
        GenericRecord enqueue = new GenericData.Record(enqueueSchema);
        enqueue.put("queue", queue);
        enqueue.put("message_id", messageId);
        enqueue.put("body", ByteBuffer.wrap(body));
        enqueue.put("headers", Map.of());
        enqueue.put("ordering_key", null);
        enqueue.put("not_before_ms", null);
        enqueue.put("expires_at_ms", null);
        GenericRecord command = new GenericData.Record(commandSchema);
        command.put("command_id", commandId);
        command.put("domain", domain);
        command.put("principal", credential.principal());
        command.put("body", enqueue);
        command.put("reply_to", replyTo);
        command.put("client_time_ms", System.currentTimeMillis());
        byte[] commandBytes = keyloadHeader(
                bytes(new BinaryMessageEncoder<GenericRecord>(GenericData.get(), commandSchema).encode(command)));
        GenericRecord signed = new GenericData.Record(signedSchema);
        signed.put("key_id", credential.keyId());
        signed.put("mac", ByteBuffer.wrap(credential.mac(commandBytes)));
        signed.put("record", ByteBuffer.wrap(commandBytes));
        byte[] value = keyloadHeader(
                bytes(new BinaryMessageEncoder<GenericRecord>(GenericData.get(), signedSchema).encode(signed)));
        byte[] key = domain.getBytes(StandardCharsets.UTF_8);

        int keyloadPartition = partitionFor(domain, commandPartitions);
        int murmur2 = murmur2Partition(key, commandPartitions);
        BinaryMessageDecoder<GenericRecord> signedDecoder = new BinaryMessageDecoder<>(GenericData.get(), signedSchema);
        BinaryMessageDecoder<GenericRecord> outcomeDecoder = new BinaryMessageDecoder<>(GenericData.get(), outcomeSchema);

        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(consumerConfig(bootstrap, prefix));
                KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(producerConfig(bootstrap))) {
            int found = producer.partitionsFor(commandsTopic).size();
            if (found != commandPartitions) {
                System.err.println(commandsTopic + " has " + found + " partitions, not " + commandPartitions
                        + ": keyload's partition would be computed modulo the wrong count");
                return 2;
            }
            // Seek to the end of the reply partition before producing, so the outcome cannot be missed:
            // position() makes the lazy seekToEnd happen now.
            TopicPartition reply = new TopicPartition(outcomesTopic, replyTo);
            consumer.assign(List.of(reply));
            consumer.seekToEnd(List.of(reply));
            long start = consumer.position(reply, OUTCOME_TIMEOUT);

            ProducerRecord<byte[], byte[]> record = defaultPartitioner
                    ? new ProducerRecord<>(commandsTopic, key, value)
                    : new ProducerRecord<>(commandsTopic, keyloadPartition, key, value);
            RecordMetadata written = producer.send(record).get(SEND_TIMEOUT_S, TimeUnit.SECONDS);
            System.out.println("produced " + commandId + " partition=" + written.partition() + " offset="
                    + written.offset() + " keyload_partition=" + keyloadPartition + " murmur2_partition=" + murmur2
                    + " reply_to=" + replyTo + " from_offset=" + start);

            GenericRecord outcome = awaitOutcome(consumer, credential, domain, commandId, signedDecoder, outcomeDecoder);
            if (outcome == null) {
                System.out.println("outcome " + commandId + " timeout - partition=" + written.partition()
                        + " offset=" + written.offset());
                return 1;
            }
            String status = outcome.get("status").toString();
            String errorCode = text(outcome.get("error_code"));
            System.out.println("outcome " + commandId + " " + status + " " + errorCode + " partition="
                    + outcome.get("partition") + " offset=" + outcome.get("offset"));
            System.out.println("detail " + outcome.get("detail"));
            boolean committed = status.equals("committed");
            if (!defaultPartitioner) {
                return committed ? 0 : 1;
            }
            boolean misplaced = written.partition() != keyloadPartition;
            if (misplaced && status.equals("rejected") && errorCode.equals("Validation")) {
                System.out.println("default-partitioner misplaced: refused as expected");
                return 0;
            }
            if (!misplaced && committed) {
                System.out.println("default-partitioner placed: murmur2 picked keyload's partition, committed");
                return 0;
            }
            System.out.println("default-partitioner unexpected: misplaced=" + misplaced);
            return 1;
        }
    }

    /** The outcome of (domain, command id) on the assigned partition, once its MAC verifies; null after the timeout. */
    static GenericRecord awaitOutcome(
            KafkaConsumer<byte[], byte[]> consumer,
            Credential credential,
            String domain,
            String commandId,
            BinaryMessageDecoder<GenericRecord> signedDecoder,
            BinaryMessageDecoder<GenericRecord> outcomeDecoder) {
        long deadline = System.nanoTime() + OUTCOME_TIMEOUT.toNanos();
        while (System.nanoTime() < deadline) {
            for (ConsumerRecord<byte[], byte[]> published : consumer.poll(POLL)) {
                GenericRecord sealed;
                try {
                    sealed = signedDecoder.decode(keyloadHeader(published.value()));
                } catch (IOException | AvroRuntimeException e) {
                    // Not a sealed outcome (an unsealed refusal, another writer's record): nothing to trust.
                    System.err.println("offset " + published.offset() + ": not a keyload.Signed record: " + e);
                    continue;
                }
                byte[] inner = bytes((ByteBuffer) sealed.get("record"));
                GenericRecord outcome;
                try {
                    outcome = outcomeDecoder.decode(keyloadHeader(inner));
                } catch (IOException | AvroRuntimeException e) {
                    System.err.println("offset " + published.offset() + ": not a keyload.Outcome record: " + e);
                    continue;
                }
                if (!commandId.equals(outcome.get("command_id").toString())
                        || !domain.equals(outcome.get("domain").toString())) { // command ids are scoped by domain
                    continue;
                }
                boolean ours = credential.keyId().equals(sealed.get("key_id").toString());
                if (!ours || !credential.verifies(inner, bytes((ByteBuffer) sealed.get("mac")))) {
                    System.err.println("an outcome for " + commandId + " at offset " + published.offset()
                            + " is not sealed with our key: ignored");
                    continue;
                }
                return outcome;
            }
        }
        return null;
    }

    static Properties producerConfig(String bootstrap) {
        Properties config = new Properties();
        config.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        config.put(ProducerConfig.ACKS_CONFIG, "all");
        config.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        config.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        config.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        return config;
    }

    static Properties consumerConfig(String bootstrap, String prefix) {
        Properties config = new Properties();
        config.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        // Partitions are assigned, never subscribed: the group is never joined and nothing is committed.
        config.put(ConsumerConfig.GROUP_ID_CONFIG, prefix + ".reader");
        config.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        config.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        config.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        config.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        return config;
    }
}
