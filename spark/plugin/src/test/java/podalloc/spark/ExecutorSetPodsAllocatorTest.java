package podalloc.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.fabric8.kubernetes.client.KubernetesClient;
import io.fabric8.kubernetes.client.KubernetesClientBuilder;
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
}
