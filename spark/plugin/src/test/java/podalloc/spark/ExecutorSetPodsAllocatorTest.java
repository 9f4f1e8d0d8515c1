package podalloc.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import io.fabric8.kubernetes.client.ConfigBuilder;
import io.fabric8.kubernetes.client.KubernetesClient;
import io.fabric8.kubernetes.client.KubernetesClientBuilder;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.Iterator;
import java.util.HashMap;
import java.util.Map;
import org.apache.spark.SecurityManager;
import org.apache.spark.SecurityManager$;
import org.apache.spark.SparkConf;
import org.apache.spark.resource.ExecutorResourceRequests;
import org.apache.spark.resource.ResourceProfile;
import org.apache.spark.resource.ResourceProfileBuilder;
import org.apache.spark.resource.ResourceProfile$;
import org.apache.spark.resource.TaskResourceRequests;
import org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBuilder;
import org.junit.jupiter.api.Test;
import scala.Option;

/**
 * The ExecutorSets the plugin writes for each resource profile: their names, the object it
 * creates, the existing objects it refuses, and the executor pod template Spark's own builder
 * gives for a second profile (its cores and memory), less what podalloc fills per executor.
 * No API server: the builder makes no request without a pod template file.
 */
class ExecutorSetPodsAllocatorTest {
  private final ObjectMapper json = new ObjectMapper();

  @Test
  void profileSetsAreNamedAsPodallocNamesThem() {
    assertEquals("etl", ExecutorSetPodsAllocator.setName("etl", 0));
    assertEquals("etl-rp1", ExecutorSetPodsAllocator.setName("etl", 1));
    assertEquals("etl-rp12", ExecutorSetPodsAllocator.setName("etl", 12));
  }

  @Test
  void aProfileSetNamesItsProfileAndProfileZerosDoesNot() {
    JsonNode template = json.createObjectNode().putObject("spec");
    ObjectNode rp1 = ExecutorSetPodsAllocator.newSet(json, "spark", "etl-rp1", "app-1", 1, template);
    assertEquals("podalloc.io/v1alpha1", rp1.path("apiVersion").asText());
    assertEquals("ExecutorSet", rp1.path("kind").asText());
    assertEquals("etl-rp1", rp1.path("metadata").path("name").asText());
    assertEquals("spark", rp1.path("metadata").path("namespace").asText());
    assertEquals("app-1", rp1.path("metadata").path("labels").path("spark-app-selector").asText());
    assertEquals("app-1", rp1.path("spec").path("appId").asText());
    assertEquals(1, rp1.path("spec").path("resourceProfile").asInt(-1));
    assertEquals(template, rp1.path("spec").path("template"));
    assertFalse(rp1.path("spec").has("replicas"), "the target is written apart, by the writer");
    ObjectNode rp0 = ExecutorSetPodsAllocator.newSet(json, "spark", "etl", "app-1", 0, template);
    assertFalse(rp0.path("spec").has("resourceProfile"));
  }

  @Test
  void anExistingSetOfAnotherAppOrProfileIsRefused() throws Exception {
    JsonNode mine = json.readTree("{\"spec\":{\"appId\":\"a\",\"resourceProfile\":1}}");
    assertNull(ExecutorSetPodsAllocator.refusal(mine, "a", 1));
    assertTrue(ExecutorSetPodsAllocator.refusal(mine, "a", 2).contains("resource profile 1"));
    assertTrue(ExecutorSetPodsAllocator.refusal(mine, "b", 1).contains("app a"));
    JsonNode home = json.readTree("{\"spec\":{\"appId\":\"a\"}}");
    assertNull(ExecutorSetPodsAllocator.refusal(home, "a", 0));
    assertTrue(ExecutorSetPodsAllocator.refusal(home, "a", 1).contains("resource profile 0"));
  }

  @Test
  void aSecondProfilesTemplateHasItsCoresAndMemoryAndNoExecutorId() {
    SparkConf conf =
        new SparkConf(false)
            .set("spark.master", "k8s://https://127.0.0.1:6443")
            .set("spark.app.id", "app-1")
            .set("spark.kubernetes.namespace", "spark")
            .set("spark.kubernetes.container.image", "spark-executor")
            .set("spark.driver.host", "127.0.0.1")
            .set("spark.driver.port", "7078")
            .set("spark.executor.cores", "1")
            .set("spark.executor.memory", "512m");
    SecurityManager sec =
        new SecurityManager(conf, Option.<byte[]>empty(), SecurityManager$.MODULE$.$lessinit$greater$default$3());
    try (KubernetesClient client = new KubernetesClientBuilder().build()) {
      ExecutorSetPodsAllocator alloc =
          new ExecutorSetPodsAllocator(conf, sec, new KubernetesExecutorBuilder(), client, null, null);
      alloc.bind("app-1");
      // As in a driver: the default profile (id 0) exists before any other.
      ResourceProfile first = ResourceProfile$.MODULE$.getOrCreateDefaultProfile(conf);
      ResourceProfile second =
          new ResourceProfileBuilder()
              .require(new ExecutorResourceRequests().cores(2).memory("640m"))
              .require(new TaskResourceRequests().cpus(1))
              .build();
      JsonNode t1 = alloc.template(second);
      JsonNode c1 = t1.path("spec").path("containers").path(0);
      Map<String, String> env = env(c1);
      assertEquals("2", env.get("SPARK_EXECUTOR_CORES"));
      assertEquals("640m", env.get("SPARK_EXECUTOR_MEMORY"));
      assertEquals(String.valueOf(second.id()), env.get("SPARK_RESOURCE_PROFILE_ID"));
      assertFalse(env.containsKey("SPARK_EXECUTOR_ID"));
      assertEquals("2", c1.path("resources").path("requests").path("cpu").asText());
      // 640m and Spark's minimum overhead of 384m.
      assertEquals("1024Mi", c1.path("resources").path("limits").path("memory").asText());
      JsonNode labels = t1.path("metadata").path("labels");
      assertEquals(String.valueOf(second.id()), labels.path("spark-exec-resourceprofile-id").asText());
      assertFalse(labels.has("spark-exec-id"));
      assertFalse(t1.path("metadata").has("name"));
      assertFalse(t1.path("spec").has("hostname"));

      assertTrue(second.id() > 0);
      JsonNode t0 = alloc.template(first);
      Map<String, String> env0 = env(t0.path("spec").path("containers").path(0));
      assertEquals("1", env0.get("SPARK_EXECUTOR_CORES"));
      assertEquals("512m", env0.get("SPARK_EXECUTOR_MEMORY"));
      assertEquals("0", env0.get("SPARK_RESOURCE_PROFILE_ID"));
    }
  }

  private static Map<String, String> env(JsonNode container) {
    Map<String, String> out = new HashMap<>();
    for (JsonNode e : container.path("env")) {
      out.put(e.path("name").asText(), e.path("value").asText(null));
    }
    return out;
  }

  /**
   * A removal whose write landed but whose answer was lost (here a 500 after the commit) is
   * found on the next round, not written again under a new request id: spec.removals holds it
   * once and spec.replicas is lowered once (it was lowered twice before).
   */
  @Test
  void aRemovalWhoseAnswerWasLostIsNotWrittenTwice() throws Exception {
    ObjectNode es = (ObjectNode) json.readTree(
        "{\"apiVersion\":\"podalloc.io/v1alpha1\",\"kind\":\"ExecutorSet\","
            + "\"metadata\":{\"name\":\"etl\",\"namespace\":\"ns\",\"resourceVersion\":\"1\"},"
            + "\"spec\":{\"appId\":\"etl\",\"replicas\":4}}");
    int[] patches = {0};
    HttpServer server = HttpServer.create(new InetSocketAddress("127.0.0.1", 0), 0);
    server.createContext("/apis/podalloc.io/v1alpha1/namespaces/ns/executorsets/etl", ex -> {
      synchronized (es) {
        if (ex.getRequestMethod().equals("PATCH")) {
          JsonNode patch = json.readTree(ex.getRequestBody());
          String rv = patch.path("metadata").path("resourceVersion").asText("");
          if (!rv.isEmpty() && !rv.equals(es.path("metadata").path("resourceVersion").asText())) {
            answer(ex, 409, "{\"kind\":\"Status\",\"code\":409,\"reason\":\"Conflict\"}");
            return;
          }
          merge(es, patch);
          int next = es.path("metadata").path("resourceVersion").asInt() + 1;
          ((ObjectNode) es.get("metadata")).put("resourceVersion", Integer.toString(next));
          if (patches[0]++ == 0) {
            answer(ex, 500, "{\"kind\":\"Status\",\"code\":500,\"message\":\"lost\"}");
            return;
          }
        }
        answer(ex, 200, json.writeValueAsString(es));
      }
    });
    server.start();
    try (KubernetesClient client = new KubernetesClientBuilder()
        .withConfig(new ConfigBuilder()
            .withMasterUrl("http://127.0.0.1:" + server.getAddress().getPort())
            .withRequestRetryBackoffLimit(0)
            .build())
        .build()) {
      SparkConf conf = new SparkConf(false).set("spark.kubernetes.namespace", "ns");
      ExecutorSetPodsAllocator a = new ExecutorSetPodsAllocator(conf, null, null, client, null, null);
      a.followExisting("etl");
      a.killed("3");
      a.flushQuietly(); // the write lands, its answer is a 500
      a.flushQuietly(); // finds it
      a.flushQuietly();
      synchronized (es) {
        JsonNode removals = es.path("spec").path("removals");
        assertEquals(1, removals.size(), es.toString());
        assertEquals(3, removals.get(0).path("executors").get(0).asInt(), es.toString());
        assertEquals(3, es.path("spec").path("replicas").asInt(), es.toString());
      }
      assertTrue(a.isDeleted("3"));
    } finally {
      server.stop(0);
    }
  }

  private static void answer(HttpExchange ex, int code, String body) throws IOException {
    byte[] bytes = body.getBytes(StandardCharsets.UTF_8);
    ex.getResponseHeaders().set("Content-Type", "application/json");
    ex.sendResponseHeaders(code, bytes.length);
    ex.getResponseBody().write(bytes);
    ex.close();
  }

  /** A JSON merge patch (RFC 7386) applied to {@code target}. */
  private static void merge(ObjectNode target, JsonNode patch) {
    Iterator<Map.Entry<String, JsonNode>> fields = patch.fields();
    while (fields.hasNext()) {
      Map.Entry<String, JsonNode> f = fields.next();
      if (f.getValue().isNull()) {
        target.remove(f.getKey());
      } else if (f.getValue().isObject() && target.path(f.getKey()).isObject()) {
        merge((ObjectNode) target.get(f.getKey()), f.getValue());
      } else {
        target.set(f.getKey(), f.getValue());
      }
    }
  }
}
