package podalloc.peer;

import static org.mockito.Mockito.mock;
import static org.mockito.Mockito.when;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.fabric8.kubernetes.client.Config;
import io.fabric8.kubernetes.client.KubernetesClient;
import io.fabric8.kubernetes.client.KubernetesClientBuilder;
import io.fabric8.kubernetes.client.http.AsyncBody;
import io.fabric8.kubernetes.client.http.BasicBuilder;
import io.fabric8.kubernetes.client.http.HttpRequest;
import io.fabric8.kubernetes.client.http.HttpResponse;
import io.fabric8.kubernetes.client.http.Interceptor;
import java.io.PrintStream;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ThreadFactory;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.spark.SecurityManager;
import org.apache.spark.SecurityManager$;
import org.apache.spark.SparkConf;
import org.apache.spark.resource.ExecutorResourceRequests;
import org.apache.spark.resource.ResourceProfile;
import org.apache.spark.resource.ResourceProfile$;
import org.apache.spark.resource.ResourceProfileBuilder;
import org.apache.spark.scheduler.cluster.k8s.ExecutorPodState;
import org.apache.spark.scheduler.cluster.k8s.ExecutorPodsAllocator;
import org.apache.spark.scheduler.cluster.k8s.ExecutorPodsLifecycleManager;
import org.apache.spark.scheduler.cluster.k8s.ExecutorPodsPollingSnapshotSource;
import org.apache.spark.scheduler.cluster.k8s.ExecutorPodsSnapshot;
import org.apache.spark.scheduler.cluster.k8s.ExecutorPodsSnapshotsStoreImpl;
import org.apache.spark.scheduler.cluster.k8s.ExecutorPodsWatchSnapshotSource;
import org.apache.spark.scheduler.cluster.k8s.KubernetesClusterSchedulerBackend;
import org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBuilder;
import org.apache.spark.scheduler.cluster.k8s.PodRunning;
import org.apache.spark.util.SystemClock;
import scala.collection.JavaConverters;
import scala.runtime.AbstractFunction1;
import scala.runtime.BoxedUnit;

/**
 * Spark's own Kubernetes executor allocator ({@code ExecutorPodsAllocator}), outside a driver.
 *
 * <p>Built as Spark's {@code KubernetesClusterManager} and {@code ExecutorPodsAllocatorSuite}
 * build it: a {@link SparkConf}, the real {@link KubernetesExecutorBuilder}, a fabric8 client
 * from a kubeconfig, the real {@link ExecutorPodsSnapshotsStoreImpl} fed by the polling
 * snapshot source (and the watch source when the scenario says the server has watch), Spark's
 * {@link ExecutorPodsLifecycleManager} (which deletes failed and succeeded executor pods, as
 * in a driver), and a stand-in scheduler backend that reports as registered every executor
 * whose pod is Running in the latest snapshot.
 *
 * <p>It plays the scenario's target changes ({@code {"at_ms": T, "target": N}}, with {@code
 * "profile": P} for resource profile P's; the profiles other than the default one, 0, are
 * declared under {@code "profiles": {"1": {"cores": 2, "memory": "512m"}}} and built with
 * Spark's {@link ResourceProfileBuilder}, so they get ids 1, 2, ... as in a driver) against the
 * allocator, each time with the targets of every profile that has one (as a driver's {@code
 * ExecutorAllocationManager} does), and writes every request the allocator (and the lifecycle manager) makes that
 * changes the cluster, as JSON lines: {@code {"ms", "op": "create"|"delete", "ids", "name",
 * "status"}}. Fault events of the scenario are driven from outside (peers/compare.py).
 *
 * <p>Usage: {@code SparkPeer --kubeconfig F --scenario S.json --out decisions.jsonl
 * [--namespace NS] [--app-id APP] [--driver-pod NAME] [--wait-for GO_FILE]}
 */
public final class SparkPeer {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final Pattern EXEC_ID_IN = Pattern.compile("spark-exec-id in \\(([0-9, ]*)\\)");
  private static final Pattern EXEC_NAME = Pattern.compile("-exec-([0-9]+)$");

  private static long t0;
  private static PrintStream out;

  private SparkPeer() {}

  public static void main(String[] argv) throws Exception {
    Map<String, String> a = parseArgs(argv);
    JsonNode sc = JSON.readTree(Files.readString(Path.of(req(a, "scenario"))));
    String ns = a.getOrDefault("namespace", text(sc, "namespace", "default"));
    String app = a.getOrDefault("app-id", text(sc, "app_id", "peer-app"));
    String driver = a.getOrDefault("driver-pod", text(sc, "driver_pod", app + "-driver"));
    out = new PrintStream(Files.newOutputStream(Path.of(req(a, "out"))), true, "UTF-8");

    long batchDelay = sc.path("batch_delay_ms").asLong(1000);
    // "defaults": true leaves Spark's own defaults for what the scenario does not set: batch
    // size (5 in 3.5, 10 in 4.0), batch delay 1 s, polling every 30 s and the watch source on.
    boolean defaults = sc.path("defaults").asBoolean(false);
    boolean watchOn = sc.has("watch") ? sc.get("watch").asBoolean() : defaults;
    SparkConf conf =
        new SparkConf(false)
            .set("spark.app.id", app)
            .set("spark.app.name", app)
            .set("spark.master", "k8s://https://127.0.0.1")
            .set("spark.kubernetes.namespace", ns)
            .set("spark.kubernetes.container.image", text(sc, "image", "spark:peer"))
            .set("spark.kubernetes.executor.podNamePrefix", app)
            .set("spark.kubernetes.driver.pod.name", driver)
            // PVC reuse lists PersistentVolumeClaims, which the simulator does not serve.
            .set("spark.kubernetes.driver.reusePersistentVolumeClaim", "false")
            .set("spark.kubernetes.driver.ownPersistentVolumeClaim", "false")
            .set("spark.driver.host", "127.0.0.1")
            .set("spark.driver.port", "7078")
            .set("spark.executor.cores", "1")
            .set("spark.executor.memory", "256m")
            .set("spark.kubernetes.executor.request.cores", "100m")
            .set("spark.kubernetes.executor.disableConfigMap", "true")
            .set("spark.kubernetes.executor.enableApiWatcher", String.valueOf(watchOn))
            .set("spark.kubernetes.executor.deleteOnTermination", "true")
            // The 3.5 allocator (4.0: the lifecycle manager) exits the JVM past this.
            .set("spark.executor.maxNumFailures", "1000000");
    if (sc.has("batch_size") || !defaults) {
      conf.set("spark.kubernetes.allocation.batch.size", sc.path("batch_size").asText("5"));
    }
    if (sc.has("batch_delay_ms") || !defaults) {
      conf.set("spark.kubernetes.allocation.batch.delay", batchDelay + "ms");
    }
    if (sc.has("poll_ms") || !defaults) {
      conf.set(
          "spark.kubernetes.executor.apiPollingInterval",
          sc.path("poll_ms").asLong(batchDelay) + "ms");
    }
    setMs(conf, sc, "executor_idle_timeout_ms", "spark.dynamicAllocation.executorIdleTimeout");
    setMs(conf, sc, "creation_timeout_ms", "spark.kubernetes.allocation.executor.timeout");
    if (sc.has("max_pending")) {
      conf.set("spark.kubernetes.allocation.maxPendingPods", sc.get("max_pending").asText());
    }
    if (sc.has("spark_conf")) {
      sc.get("spark_conf").fields().forEachRemaining(e -> conf.set(e.getKey(), e.getValue().asText()));
    }
    ExecutorPodsSnapshot.setShouldCheckAllContainers(false);
    ExecutorPodsSnapshot.setSparkContainerName("spark-kubernetes-executor");

    if (a.containsKey("wait-for")) {
      // Load the classes and build what needs no server first, then wait for the go file:
      // a benchmark starts its simulators once every JVM is up, so the simulators' clocks
      // (their Unschedulable windows) start with the allocators, not before the JVM's start.
      ResourceProfile$.MODULE$.getOrCreateDefaultProfile(conf);
      for (Class<?> c :
          new Class<?>[] {
            ExecutorPodsAllocator.class, ExecutorPodsSnapshotsStoreImpl.class,
            ExecutorPodsPollingSnapshotSource.class, ExecutorPodsLifecycleManager.class,
            KubernetesExecutorBuilder.class, KubernetesClientBuilder.class
          }) {
        Class.forName(c.getName(), true, SparkPeer.class.getClassLoader());
      }
      mock(KubernetesClusterSchedulerBackend.class);
      Path go = Path.of(a.get("wait-for"));
      Files.writeString(Path.of(go + ".ready"), "ready\n");
      while (!Files.exists(go)) Thread.sleep(20);
    }
    Config cfg = Config.fromKubeconfig(Files.readString(Path.of(req(a, "kubeconfig"))));
    cfg.setNamespace(ns);
    // A driver's defaults are 10 s (spark.kubernetes.driver.{request,connection}Timeout); 30 s
    // here, because on a loaded 2-core CI machine the first connection of a cold JVM (Vert.x
    // in Spark 4.0) took longer than 10 s and the harness did not start. No scenario times a
    // request out, so the peer's decisions are the same.
    cfg.setRequestTimeout(30000);
    cfg.setConnectionTimeout(30000);
    cfg.setRequestRetryBackoffLimit(3);
    KubernetesClient client =
        new KubernetesClientBuilder()
            .withConfig(cfg)
            .withHttpClientBuilderConsumer(b -> b.addOrReplaceInterceptor("peer", new Recorder()))
            .build();

    ScheduledExecutorService subscribers = Executors.newScheduledThreadPool(2, daemon("snapshots"));
    ExecutorPodsSnapshotsStoreImpl store =
        new ExecutorPodsSnapshotsStoreImpl(subscribers, new SystemClock(), conf);

    // The stand-in backend: executors whose pod is Running in the latest snapshot are
    // "registered" (a real driver learns of them when the executor JVM connects).
    Set<String> registered = ConcurrentHashMap.newKeySet();
    // Raw Function1: its argument is scala.collection.Seq in Scala 2.12 (Spark 3.5) and
    // scala.collection.immutable.Seq in 2.13 (Spark 4.0).
    @SuppressWarnings({"rawtypes", "unchecked"})
    scala.Function1 onSnapshots =
        new AbstractFunction1<Object, BoxedUnit>() {
          @Override
          public BoxedUnit apply(Object arg) {
            @SuppressWarnings("unchecked")
            scala.collection.Seq<ExecutorPodsSnapshot> snaps =
                (scala.collection.Seq<ExecutorPodsSnapshot>) arg;
            if (snaps.nonEmpty()) {
              Set<String> running = new TreeSet<>();
              Map<Object, ExecutorPodState> pods =
                  JavaConverters.mapAsJavaMap(snaps.last().executorPods());
              pods.forEach(
                  (id, st) -> {
                    if (st instanceof PodRunning) running.add(id.toString());
                  });
              registered.retainAll(running);
              registered.addAll(running);
            }
            return BoxedUnit.UNIT;
          }
        };
    store.addSubscriber(batchDelay, onSnapshots);
    KubernetesClusterSchedulerBackend backend = mock(KubernetesClusterSchedulerBackend.class);
    when(backend.getExecutorIds())
        .thenAnswer(inv -> JavaConverters.asScalaBuffer(new ArrayList<>(registered)).toList());
    when(backend.getExecutorsWithRegistrationTs())
        .thenAnswer(inv -> scala.collection.immutable.Map$.MODULE$.empty());

    Map<Integer, ResourceProfile> profiles = profiles(conf, sc);
    SecurityManager sec =
        new SecurityManager(
            conf,
            SecurityManager$.MODULE$.$lessinit$greater$default$2(),
            SecurityManager$.MODULE$.$lessinit$greater$default$3());
    ExecutorPodsAllocator alloc =
        new ExecutorPodsAllocator(
            conf, sec, new KubernetesExecutorBuilder(), client, store, new SystemClock());
    ExecutorPodsLifecycleManager lifecycle = lifecycleManager(conf, client, store);
    ExecutorPodsPollingSnapshotSource polling =
        new ExecutorPodsPollingSnapshotSource(
            conf, client, store, Executors.newSingleThreadScheduledExecutor(daemon("polling")));
    ExecutorPodsWatchSnapshotSource watch =
        watchOn ? new ExecutorPodsWatchSnapshotSource(store, client, conf) : null;

    // The target changes, grouped by time: the targets of every profile after each.
    TreeMap<Long, List<JsonNode>> changes = new TreeMap<>();
    sc.path("events")
        .forEach(
            e -> {
              if (e.has("target")) {
                changes.computeIfAbsent(e.path("at_ms").asLong(), k -> new ArrayList<>()).add(e);
              }
            });
    Map<Integer, Integer> current = new TreeMap<>();
    long duration = sc.path("duration_ms").asLong(20000);

    // The driver's order (KubernetesClusterSchedulerBackend.start): the lifecycle manager,
    // the allocator, the initial target, then the watch and polling sources.
    t0 = System.currentTimeMillis();
    event("start", Map.of("spark", org.apache.spark.package$.MODULE$.SPARK_VERSION()));
    lifecycle.start(backend);
    alloc.start(app, backend);
    current.put(0, 0);
    if (changes.containsKey(0L)) apply(current, changes.remove(0L), profiles);
    setTargets(alloc, profiles, current);
    if (watch != null) watch.start(app);
    polling.start(app);
    if (sc.has("target_file")) {
      watchTargetFile(Path.of(sc.get("target_file").asText()), alloc, profiles, current);
    }
    for (Map.Entry<Long, List<JsonNode>> c : changes.entrySet()) {
      sleepUntil(c.getKey());
      apply(current, c.getValue(), profiles);
      setTargets(alloc, profiles, current);
    }
    sleepUntil(duration);
    event("end", Map.of());
    polling.stop();
    if (watch != null) watch.stop();
    store.stop();
    client.close();
    out.close();
    System.exit(0);
  }

  /** (conf, client, store) in Spark 3.5; 4.0 adds a Clock. */
  private static ExecutorPodsLifecycleManager lifecycleManager(
      SparkConf conf, KubernetesClient client, ExecutorPodsSnapshotsStoreImpl store)
      throws ReflectiveOperationException {
    for (java.lang.reflect.Constructor<?> c : ExecutorPodsLifecycleManager.class.getConstructors()) {
      Object[] args =
          c.getParameterCount() == 3
              ? new Object[] {conf, client, store}
              : new Object[] {conf, client, store, new SystemClock()};
      if (c.getParameterCount() == 3 || c.getParameterCount() == 4) {
        return (ExecutorPodsLifecycleManager) c.newInstance(args);
      }
    }
    throw new IllegalStateException("no known ExecutorPodsLifecycleManager constructor");
  }

  /**
   * The default profile (id 0) and the scenario's other profiles, built in id order as a driver
   * builds them ({@code ResourceProfileBuilder.build} takes the next id of the JVM's counter,
   * after the default profile's 0).
   */
  private static Map<Integer, ResourceProfile> profiles(SparkConf conf, JsonNode sc) {
    Map<Integer, ResourceProfile> out = new TreeMap<>();
    out.put(0, ResourceProfile$.MODULE$.getOrCreateDefaultProfile(conf));
    TreeMap<Integer, JsonNode> wanted = new TreeMap<>();
    sc.path("profiles").fields().forEachRemaining(e -> wanted.put(Integer.parseInt(e.getKey()), e.getValue()));
    for (Map.Entry<Integer, JsonNode> e : wanted.entrySet()) {
      JsonNode p = e.getValue();
      ResourceProfile rp =
          new ResourceProfileBuilder()
              .require(
                  new ExecutorResourceRequests()
                      .cores(p.path("cores").asInt(1))
                      .memory(p.path("memory").asText("256m")))
              .build();
      if (rp.id() != e.getKey()) {
        throw new IllegalStateException(
            "profile " + e.getKey() + " was built with id " + rp.id()
                + ": declare profiles 1, 2, ... without gaps");
      }
      out.put(rp.id(), rp);
    }
    return out;
  }

  /** The target changes of one instant applied to the targets by profile. */
  private static void apply(
      Map<Integer, Integer> current, List<JsonNode> evs, Map<Integer, ResourceProfile> profiles) {
    for (JsonNode e : evs) {
      int p = e.path("profile").asInt(0);
      if (!profiles.containsKey(p)) {
        throw new IllegalArgumentException("a target for profile " + p + ", not under \"profiles\"");
      }
      current.put(p, e.get("target").asInt());
    }
  }

  /** A target written to this file (a number) is set when the file appears or changes. */
  private static void watchTargetFile(
      Path f,
      ExecutorPodsAllocator alloc,
      Map<Integer, ResourceProfile> profiles,
      Map<Integer, Integer> current) {
    Thread t =
        new Thread(
            () -> {
              String last = null;
              while (true) {
                try {
                  if (Files.exists(f)) {
                    String v = Files.readString(f).trim();
                    if (!v.isEmpty() && !v.equals(last)) {
                      last = v;
                      current.put(0, Integer.parseInt(v));
                      setTargets(alloc, profiles, current);
                    }
                  }
                  Thread.sleep(50);
                } catch (Exception e) {
                  return;
                }
              }
            },
            "peer-target-file");
    t.setDaemon(true);
    t.start();
  }

  /** Every profile's target at once, as a driver's ExecutorAllocationManager sets them. */
  private static synchronized void setTargets(
      ExecutorPodsAllocator alloc,
      Map<Integer, ResourceProfile> profiles,
      Map<Integer, Integer> current) {
    scala.collection.immutable.Map<ResourceProfile, Object> m =
        scala.collection.immutable.Map$.MODULE$.empty();
    Map<String, Integer> logged = new TreeMap<>();
    for (Map.Entry<Integer, Integer> e : current.entrySet()) {
      m = m.updated(profiles.get(e.getKey()), (Object) e.getValue());
      logged.put(e.getKey().toString(), e.getValue());
    }
    event("target", Map.of("target", current.get(0), "targets", logged));
    alloc.setTotalExpectedExecutors(m);
  }

  /** Logs the requests that change the cluster, with the executor ids they name. */
  static final class Recorder implements Interceptor {
    @Override
    public void after(
        HttpRequest req,
        HttpResponse<?> resp,
        AsyncBody.Consumer<List<ByteBuffer>> consumer) {
      String m = req.method();
      if (!m.equals("POST") && !m.equals("DELETE")) return;
      String path = req.uri().getPath();
      if (!path.contains("/pods")) return;
      Map<String, Object> f = new HashMap<>();
      String query = req.uri().getQuery();
      List<Long> ids = new ArrayList<>();
      if (m.equals("POST")) {
        try {
          JsonNode pod = JSON.readTree(req.bodyString());
          String name = pod.path("metadata").path("name").asText();
          f.put("name", name);
          ids.add(pod.path("metadata").path("labels").path("spark-exec-id").asLong());
        } catch (Exception e) {
          f.put("error", e.toString());
        }
        f.put("op", "create");
      } else {
        f.put("op", "delete");
        Matcher byName = EXEC_NAME.matcher(path);
        if (byName.find()) {
          f.put("name", path.substring(path.lastIndexOf('/') + 1));
          ids.add(Long.parseLong(byName.group(1)));
        } else if (query != null) {
          Matcher in = EXEC_ID_IN.matcher(query);
          if (in.find()) {
            for (String s : in.group(1).split(",")) {
              if (!s.isBlank()) ids.add(Long.parseLong(s.trim()));
            }
          }
          f.put("collection", true);
        }
        if (query != null) f.put("query", query);
      }
      f.put("ids", ids);
      f.put("status", resp.code());
      event(null, f);
    }
  }

  private static synchronized void event(String op, Map<String, ?> fields) {
    ObjectNode o = JSON.createObjectNode();
    o.put("ms", System.currentTimeMillis() - t0);
    if (op != null) o.put("op", op);
    fields.forEach((k, v) -> o.set(k, JSON.valueToTree(v)));
    out.println(o.toString());
  }

  private static void sleepUntil(long atMs) throws InterruptedException {
    long left = t0 + atMs - System.currentTimeMillis();
    if (left > 0) Thread.sleep(left);
  }

  private static void setMs(SparkConf conf, JsonNode sc, String field, String key) {
    if (sc.has(field)) conf.set(key, sc.get(field).asLong() + "ms");
  }

  private static String text(JsonNode n, String field, String dflt) {
    return n.has(field) ? n.get(field).asText() : dflt;
  }

  private static ThreadFactory daemon(String name) {
    AtomicInteger n = new AtomicInteger();
    return r -> {
      Thread t = new Thread(r, "peer-" + name + "-" + n.incrementAndGet());
      t.setDaemon(true);
      return t;
    };
  }

  private static String req(Map<String, String> a, String k) {
    String v = a.get(k);
    if (v == null) {
      System.err.println("spark-peer: --" + k + " is required");
      System.err.println(
          "usage: SparkPeer --kubeconfig F --scenario S.json --out decisions.jsonl"
              + " [--namespace NS] [--app-id APP] [--driver-pod NAME]");
      System.exit(2);
    }
    return v;
  }

  private static Map<String, String> parseArgs(String[] argv) {
    Map<String, String> a = new HashMap<>();
    for (int i = 0; i + 1 < argv.length; i += 2) {
      if (!argv[i].startsWith("--")) throw new IllegalArgumentException("bad argument " + argv[i]);
      a.put(argv[i].substring(2), argv[i + 1]);
    }
    return a;
  }

  static String utf8(byte[] b) {
    return new String(b, StandardCharsets.UTF_8);
  }
}
