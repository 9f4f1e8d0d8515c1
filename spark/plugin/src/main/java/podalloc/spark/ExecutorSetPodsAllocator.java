package podalloc.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.fabric8.kubernetes.api.model.Container;
import io.fabric8.kubernetes.api.model.GenericKubernetesResource;
import io.fabric8.kubernetes.api.model.Pod;
import io.fabric8.kubernetes.api.model.PodBuilder;
import io.fabric8.kubernetes.client.KubernetesClient;
import io.fabric8.kubernetes.client.KubernetesClientException;
import io.fabric8.kubernetes.client.dsl.MixedOperation;
import io.fabric8.kubernetes.client.dsl.Resource;
import io.fabric8.kubernetes.client.dsl.base.PatchContext;
import io.fabric8.kubernetes.client.dsl.base.PatchType;
import io.fabric8.kubernetes.client.dsl.base.ResourceDefinitionContext;
import io.fabric8.kubernetes.api.model.GenericKubernetesResourceList;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import org.apache.spark.SecurityManager;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkContext;
import org.apache.spark.SparkContext$;
import org.apache.spark.SparkException;
import org.apache.spark.deploy.k8s.KubernetesConf$;
import org.apache.spark.deploy.k8s.KubernetesExecutorConf;
import org.apache.spark.deploy.k8s.KubernetesExecutorSpec;
import org.apache.spark.resource.ResourceProfile;
import org.apache.spark.resource.ResourceProfile$;
import org.apache.spark.scheduler.SparkListener;
import org.apache.spark.scheduler.SparkListenerExecutorAdded;
import org.apache.spark.scheduler.SparkListenerExecutorRemoved;
import org.apache.spark.scheduler.cluster.k8s.AbstractPodsAllocator;
import org.apache.spark.scheduler.cluster.k8s.ExecutorPodsSnapshotsStore;
import org.apache.spark.scheduler.cluster.k8s.KubernetesClusterSchedulerBackend;
import org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBuilder;
import org.apache.spark.util.Clock;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import scala.Option;
import scala.Tuple2;

/**
 * A Spark executor pods allocator that hands allocation to podalloc through an ExecutorSet
 * (group {@code podalloc.io}, version {@code v1alpha1}; the contract is podalloc's {@code
 * docs/executorset.md}). Spark 3.3 and later load it with {@code
 * spark.kubernetes.allocation.pods.allocator=podalloc.spark.ExecutorSetPodsAllocator}; the
 * driver then creates no executor pod itself. podalloc ({@code podalloc run --state-store
 * executorset:NAME}) creates and deletes them.
 *
 * <ul>
 *   <li>{@link #start}: creates ExecutorSet {@code spark.podalloc.executorSet} (default: the
 *       app id) in the driver's namespace, labelled {@code spark-app-selector=<app id>}, with
 *       {@code spec.appId} and {@code spec.template}: the executor pod Spark itself would
 *       create for resource profile 0, built by Spark's {@code KubernetesExecutorBuilder}, less
 *       what differs per executor (name, hostname, label {@code spark-exec-id}, env {@code
 *       SPARK_EXECUTOR_ID}), which podalloc fills. An existing ExecutorSet of this app gets the
 *       template; one of another app is refused (the driver fails to start).
 *   <li>Every other resource profile P (stage-level scheduling) gets an ExecutorSet of its own,
 *       {@code NAME-rpP} (podalloc's naming: docs/executorset.md, "Resource profiles"), the
 *       first time the driver gives it a target: the same label and {@code spec.appId}, {@code
 *       spec.resourceProfile: P} and {@code spec.template}, the pod Spark would build for P
 *       (its cores and memory), less the same per-executor fields. podalloc labels the pods it
 *       creates from it {@code spark-exec-resourceprofile-id=P} and sets their env {@code
 *       SPARK_RESOURCE_PROFILE_ID=P}, so the executor registers with the driver under P. It
 *       is created (or, existing for this app and profile, given the template) by the writer
 *       thread; a failure is logged and tried again at the next write.
 *   <li>{@link #setTotalExpectedExecutors}: writes each profile's target to its ExecutorSet's
 *       {@code spec.replicas} (a JSON merge patch). Writes go through one thread of this
 *       allocator, at most one round every {@code spark.podalloc.writeInterval} (200 ms), the
 *       latest target winning, so the caller (the allocation manager's thread) never waits on
 *       the API. podalloc never deletes a Running executor because the target dropped, as
 *       Spark's own allocator (the target drops to 0 between stages while executors are busy);
 *       only Pending excess goes.
 *   <li>The driver's kills (dynamic allocation's idle timeout: {@code doKillExecutors}, seen
 *       as executor removals with reason "Executor killed by driver.") reach podalloc as
 *       removals, on the ExecutorSet of the executor's profile (known from its registration,
 *       {@code SparkListenerExecutorAdded}): one conditional write (on the {@code
 *       resourceVersion} read) that appends {@code {request: <uuid>, executors: [ids]}} to
 *       {@code spec.removals}, drops entries podalloc already applied ({@code
 *       status.appliedRemovals}), lowers {@code spec.replicas} by the number of ids and names
 *       the request in annotation {@code podalloc.io/request} (so a retry after a lost answer
 *       sees it landed). podalloc then never replaces those executors. The driver's target is
 *       written again right after, so {@code spec.replicas} ends at what the driver wants.
 *   <li>{@link #isDeleted}: true for the executors this allocator asked podalloc to remove.
 *   <li>{@link #stop}: sets every profile's {@code spec.replicas} to 0 and then deletes the
 *       app's executor pods by label, as Spark's own allocator does at stop (the app is over:
 *       nothing should outlive it, and podalloc, never deleting Running executors for excess,
 *       would leave them). The replicas come first so podalloc does not replace what the
 *       driver deletes. The ExecutorSets stay (their status records the end; deleted, a
 *       running podalloc would create them again).
 * </ul>
 */
public class ExecutorSetPodsAllocator extends AbstractPodsAllocator {
  private static final Logger LOG = LoggerFactory.getLogger(ExecutorSetPodsAllocator.class);
  /** The ExecutorSet's API group/version, kind and plural. */
  static final String API_VERSION = "podalloc.io/v1alpha1";

  static final String KIND = "ExecutorSet";
  static final String REQUEST_ANNOTATION = "podalloc.io/request";
  private static final String KILLED = "killed by driver";
  private static final int CONFLICT_RETRIES = 10;
  private static final int DEFAULT_PROFILE = ResourceProfile$.MODULE$.DEFAULT_RESOURCE_PROFILE_ID();

  private final SparkConf conf;
  private final SecurityManager secMgr;
  private final KubernetesExecutorBuilder builder;
  private final KubernetesClient client;
  private final String namespace;
  private final long writeIntervalMs;
  private final ObjectMapper json = new ObjectMapper();
  private final Option<Pod> driverPod;
  private final Set<String> removed = ConcurrentHashMap.newKeySet();
  /** Executor id -> its resource profile, from the executors' registrations. */
  private final Map<String, Integer> executorProfiles = new ConcurrentHashMap<>();
  private final ScheduledExecutorService writer =
      Executors.newSingleThreadScheduledExecutor(
          r -> {
            Thread t = new Thread(r, "podalloc-executorset-writer");
            t.setDaemon(true);
            return t;
          });

  private String appId;
  private String name;
  /** Each profile's ExecutorSet, by profile id. Guarded by this. */
  private final Map<Integer, ProfileSet> profiles = new TreeMap<>();

  private volatile boolean listening;

  /** One resource profile's ExecutorSet and what the driver wants of it. */
  private static final class ProfileSet {
    final ResourceProfile profile;
    final String name;
    /** The ExecutorSet exists with this driver's template. Written by the writer thread. */
    volatile boolean ready;
    /** The driver's latest target; -1 before the first. Guarded by the allocator. */
    int wanted = -1;
    /** spec.replicas as this allocator last wrote it; -1: unknown. Guarded by the allocator. */
    int written = -1;
    /** Killed executors not yet handed over as a removal. Guarded by the allocator. */
    final Set<String> kills = new LinkedHashSet<>();
    /**
     * The removal being handed over ({@code spec.removals}' request id) and its executors:
     * kept until a write of it is known to have landed, so that a write whose answer was lost
     * (a timeout, a 5xx after the commit) is found on the next try instead of written again
     * with a new id (which would lower {@code spec.replicas} twice). Guarded by the allocator.
     */
    String request;
    List<String> requestIds;

    ProfileSet(ResourceProfile profile, String name) {
      this.profile = profile;
      this.name = name;
    }
  }

  /** The constructor Spark looks up (KubernetesClusterManager.makeExecutorPodsAllocator). */
  public ExecutorSetPodsAllocator(
      SparkConf conf,
      SecurityManager secMgr,
      KubernetesExecutorBuilder executorBuilder,
      KubernetesClient kubernetesClient,
      ExecutorPodsSnapshotsStore snapshotsStore,
      Clock clock) {
    this.conf = conf;
    this.secMgr = secMgr;
    this.builder = executorBuilder;
    this.client = kubernetesClient;
    this.namespace = conf.get("spark.kubernetes.namespace", "default");
    this.writeIntervalMs = conf.getTimeAsMs("spark.podalloc.writeInterval", "200ms");
    Option<Pod> pod = Option.empty();
    if (conf.contains("spark.kubernetes.driver.pod.name")) {
      String podName = conf.get("spark.kubernetes.driver.pod.name");
      Pod p = client.pods().inNamespace(namespace).withName(podName).get();
      if (p == null) {
        throw new IllegalStateException("no driver pod " + podName + " in " + namespace);
      }
      pod = Option.apply(p);
    }
    this.driverPod = pod;
  }

  /**
   * The ExecutorSet of resource profile {@code profile} of the app whose profile-0 ExecutorSet
   * is {@code base}: {@code base} itself for profile 0, {@code base-rpP} for P >= 1, the name
   * podalloc gives a profile's object it creates (docs/executorset.md, "Resource profiles").
   */
  static String setName(String base, int profile) {
    return profile == DEFAULT_PROFILE ? base : base + "-rp" + profile;
  }

  private MixedOperation<
          GenericKubernetesResource,
          GenericKubernetesResourceList,
          Resource<GenericKubernetesResource>>
      sets() {
    ResourceDefinitionContext ctx =
        new ResourceDefinitionContext.Builder()
            .withGroup("podalloc.io")
            .withVersion("v1alpha1")
            .withKind(KIND)
            .withPlural("executorsets")
            .withNamespaced(true)
            .build();
    return client.genericKubernetesResources(ctx);
  }

  private Resource<GenericKubernetesResource> set(String setName) {
    return sets().inNamespace(namespace).withName(setName);
  }

  @Override
  public Option<Pod> driverPod() {
    return driverPod;
  }

  @Override
  public boolean isDeleted(String executorId) {
    return removed.contains(executorId);
  }

  @Override
  public void start(String applicationId, KubernetesClusterSchedulerBackend schedulerBackend) {
    bind(applicationId);
    ProfileSet home = profile(ResourceProfile$.MODULE$.getOrCreateDefaultProfile(conf));
    try {
      ensureSet(home);
    } catch (Exception e) {
      throw new IllegalStateException("ExecutorSet " + namespace + "/" + name + ": " + e, e);
    }
    LOG.info("podalloc: executors of {} are allocated through ExecutorSet {}/{}", appId, namespace, name);
    writer.scheduleWithFixedDelay(this::flushQuietly, 0, writeIntervalMs, TimeUnit.MILLISECONDS);
  }

  /** Names the app: its id and its profile-0 ExecutorSet's name ({@code spark.podalloc.executorSet}). */
  void bind(String applicationId) {
    this.appId = applicationId;
    this.name = conf.get("spark.podalloc.executorSet", applicationId);
  }

  /** The ExecutorSet of profile {@code rp}, made known (not yet written) at its first use. */
  private synchronized ProfileSet profile(ResourceProfile rp) {
    return profiles.computeIfAbsent(rp.id(), id -> new ProfileSet(rp, setName(name, id)));
  }

  /** The executor pod Spark would create for profile {@code rp}, less what podalloc fills per executor. */
  JsonNode template(ResourceProfile rp) {
    KubernetesExecutorConf execConf =
        KubernetesConf$.MODULE$.createExecutorConf(conf, "0", appId, driverPod, rp.id());
    KubernetesExecutorSpec spec = builder.buildFromFeatures(execConf, secMgr, client, rp);
    if (!spec.executorKubernetesResources().isEmpty()) {
      LOG.warn("podalloc: the executors' extra resources (PVCs) are not handed to podalloc");
    }
    Container container = spec.pod().container();
    Pod pod =
        new PodBuilder(spec.pod().pod())
            .editOrNewSpec()
            .addToContainers(container)
            .endSpec()
            .build();
    return perExecutorFieldsRemoved(json.valueToTree(pod), json);
  }

  /**
   * {@code pod} (a Pod as a JSON tree) as an ExecutorSet's {@code spec.template}: its metadata
   * and spec only, without what podalloc fills per executor (metadata.name, label {@code
   * spark-exec-id}, spec.hostname, env {@code SPARK_EXECUTOR_ID}). Modifies {@code pod}.
   */
  static ObjectNode perExecutorFieldsRemoved(ObjectNode pod, ObjectMapper json) {
    ObjectNode meta = (ObjectNode) pod.with("metadata");
    meta.remove("name");
    if (meta.has("labels")) {
      ((ObjectNode) meta.get("labels")).remove("spark-exec-id");
    }
    ObjectNode podSpec = (ObjectNode) pod.with("spec");
    podSpec.remove("hostname");
    for (JsonNode c : podSpec.withArray("containers")) {
      Iterator<JsonNode> env = c.withArray("env").elements();
      while (env.hasNext()) {
        if ("SPARK_EXECUTOR_ID".equals(env.next().path("name").asText())) {
          env.remove();
        }
      }
    }
    ObjectNode out = json.createObjectNode();
    out.set("metadata", meta);
    out.set("spec", podSpec);
    return out;
  }

  /**
   * The ExecutorSet that {@code ensureSet} creates for profile {@code profile} of app {@code
   * appId}: label {@code spark-app-selector}, {@code spec.appId}, {@code spec.resourceProfile}
   * (profiles other than 0 only: absent is 0) and {@code spec.template}.
   */
  static ObjectNode newSet(
      ObjectMapper json, String namespace, String setName, String appId, int profile, JsonNode template) {
    ObjectNode obj = json.createObjectNode();
    obj.put("apiVersion", API_VERSION).put("kind", KIND);
    ObjectNode meta = obj.putObject("metadata");
    meta.put("name", setName).put("namespace", namespace);
    meta.putObject("labels").put("spark-app-selector", appId);
    ObjectNode spec = obj.putObject("spec");
    spec.put("appId", appId);
    if (profile != DEFAULT_PROFILE) {
      spec.put("resourceProfile", profile);
    }
    spec.set("template", template);
    return obj;
  }

  /**
   * Why an existing ExecutorSet cannot be profile {@code profile}'s of app {@code appId}: it
   * names another app ({@code spec.appId}) or another profile ({@code spec.resourceProfile},
   * absent 0, immutable); null when it can.
   */
  static String refusal(JsonNode existing, String appId, int profile) {
    JsonNode spec = existing.path("spec");
    String owner = spec.path("appId").asText("");
    if (!owner.equals(appId)) {
      return "it belongs to app " + owner + " (spec.appId), not " + appId;
    }
    int theirs = spec.path("resourceProfile").asInt(DEFAULT_PROFILE);
    if (theirs != profile) {
      return "it keeps resource profile " + theirs + " (spec.resourceProfile), not " + profile;
    }
    return null;
  }

  /** Creates the profile's ExecutorSet, or gives an existing one of this app and profile the template. */
  private void ensureSet(ProfileSet p) throws Exception {
    int profile = p.profile.id();
    JsonNode template = template(p.profile);
    ObjectNode obj = newSet(json, namespace, p.name, appId, profile, template);
    try {
      GenericKubernetesResource res = json.treeToValue(obj, GenericKubernetesResource.class);
      sets().inNamespace(namespace).resource(res).create();
      p.ready = true;
      LOG.info("podalloc: created ExecutorSet {}/{} (resource profile {})", namespace, p.name, profile);
      return;
    } catch (KubernetesClientException e) {
      if (e.getCode() != 409) {
        throw e;
      }
    }
    String why = refusal(json.valueToTree(set(p.name).get()), appId, profile);
    if (why != null) {
      throw new SparkException("ExecutorSet " + p.name + ": " + why);
    }
    ObjectNode patch = json.createObjectNode();
    patch.putObject("metadata").putObject("labels").put("spark-app-selector", appId);
    patch.putObject("spec").set("template", template);
    set(p.name).patch(PatchContext.of(PatchType.JSON_MERGE), json.writeValueAsString(patch));
    p.ready = true;
    LOG.info("podalloc: ExecutorSet {}/{} existed; its template is the driver's now", namespace, p.name);
  }

  @Override
  public void setTotalExpectedExecutors(
      scala.collection.immutable.Map<ResourceProfile, Object> resourceProfileToTotalExecs) {
    scala.collection.Iterator<Tuple2<ResourceProfile, Object>> it =
        resourceProfileToTotalExecs.iterator();
    while (it.hasNext()) {
      Tuple2<ResourceProfile, Object> e = it.next();
      int target = ((Number) e._2()).intValue();
      synchronized (this) {
        profile(e._1()).wanted = target;
      }
    }
    listen();
  }

  /** Registers the kill listener once the SparkContext is active (not yet during start). */
  private void listen() {
    if (listening) {
      return;
    }
    Option<SparkContext> sc = SparkContext$.MODULE$.getActive();
    if (sc.isEmpty()) {
      return;
    }
    synchronized (this) {
      if (listening) {
        return;
      }
      listening = true;
    }
    sc.get()
        .addSparkListener(
            new SparkListener() {
              @Override
              public void onExecutorAdded(SparkListenerExecutorAdded added) {
                executorProfiles.put(added.executorId(), added.executorInfo().resourceProfileId());
              }

              @Override
              public void onExecutorRemoved(SparkListenerExecutorRemoved removed) {
                if (removed.reason() != null && removed.reason().contains(KILLED)) {
                  killed(removed.executorId());
                }
              }
            });
  }

  /** Queues a kill on the ExecutorSet of the executor's profile (0 when it never registered). */
  synchronized void killed(String executorId) {
    if (removed.contains(executorId)) {
      return;
    }
    int id = executorProfiles.getOrDefault(executorId, DEFAULT_PROFILE);
    ProfileSet p = profiles.get(id);
    if (p == null) {
      LOG.warn("podalloc: killed executor {} of unknown resource profile {}; handed to profile 0's", executorId, id);
      p = profiles.get(DEFAULT_PROFILE);
    }
    p.kills.add(executorId);
  }

  /**
   * For tests: follows ExecutorSet {@code setName} as profile 0's, existing with this driver's
   * template already (no SparkContext and no executor builder needed).
   */
  synchronized void followExisting(String setName) {
    ProfileSet p = new ProfileSet(null, setName);
    p.ready = true;
    profiles.put(DEFAULT_PROFILE, p);
  }

  /** One round of the writer thread: each profile's ExecutorSet, its removal, its target. */
  void flushQuietly() {
    List<ProfileSet> all;
    synchronized (this) {
      all = new ArrayList<>(profiles.values());
    }
    listen();
    for (ProfileSet p : all) {
      try {
        if (!p.ready) {
          ensureSet(p);
        }
        flush(p);
      } catch (Exception e) {
        LOG.warn("podalloc: writing ExecutorSet {}/{} failed (tried again): {}", namespace, p.name, e.toString());
      }
    }
  }

  /** The profile's pending removal, then the driver's target when spec.replicas differs from it. */
  private void flush(ProfileSet p) throws Exception {
    String request;
    List<String> ids;
    synchronized (this) {
      if (p.request == null && !p.kills.isEmpty()) {
        p.request = UUID.randomUUID().toString();
        p.requestIds = new ArrayList<>(p.kills);
      }
      request = p.request;
      ids = p.requestIds;
    }
    if (request != null) {
      int replicas = remove(p.name, request, ids);
      synchronized (this) {
        p.kills.removeAll(ids);
        p.request = null;
        p.requestIds = null;
        p.written = replicas;
      }
    }
    int target;
    synchronized (this) {
      target = p.wanted;
      if (target < 0 || target == p.written) {
        return;
      }
    }
    ObjectNode patch = json.createObjectNode();
    patch.putObject("spec").put("replicas", target);
    set(p.name).patch(PatchContext.of(PatchType.JSON_MERGE), json.writeValueAsString(patch));
    synchronized (this) {
      p.written = target;
    }
    LOG.info("podalloc: {} spec.replicas = {}", p.name, target);
  }

  /**
   * Hands executors {@code ids} to podalloc as removal {@code request} on ExecutorSet {@code
   * setName} (docs/executorset.md, "Who writes what"); returns the spec.replicas written, or
   * found. Done at once when the request is already there, in {@code spec.removals} or in
   * {@code status.appliedRemovals} (an earlier write of it landed and its answer was lost); a
   * 409 reads again and applies itself to the new version.
   */
  private int remove(String setName, String request, List<String> ids) throws Exception {
    ArrayNode executors = json.createArrayNode();
    for (String id : ids) {
      try {
        executors.add(Long.parseLong(id));
      } catch (NumberFormatException e) {
        LOG.warn("podalloc: executor id {} is not a number; not handed over", id);
      }
    }
    for (int attempt = 0; ; attempt++) {
      JsonNode es = json.valueToTree(set(setName).get());
      JsonNode spec = es.path("spec");
      Set<String> applied = new LinkedHashSet<>();
      es.path("status").path("appliedRemovals").forEach(r -> applied.add(r.asText()));
      if (applied.contains(request)) {
        removed.addAll(ids);
        return spec.path("replicas").asInt(0);
      }
      ArrayNode removals = json.createArrayNode();
      for (JsonNode r : spec.path("removals")) {
        String req = r.path("request").asText();
        if (req.equals(request)) {
          removed.addAll(ids);
          return spec.path("replicas").asInt(0);
        }
        if (!applied.contains(req)) {
          removals.add(r);
        }
      }
      ObjectNode entry = removals.addObject();
      entry.put("request", request).set("executors", executors);
      int replicas = Math.max(0, spec.path("replicas").asInt(0) - executors.size());
      ObjectNode patch = json.createObjectNode();
      ObjectNode meta = patch.putObject("metadata");
      meta.put("resourceVersion", es.path("metadata").path("resourceVersion").asText());
      meta.putObject("annotations").put(REQUEST_ANNOTATION, request);
      patch.putObject("spec").put("replicas", replicas).set("removals", removals);
      try {
        set(setName).patch(PatchContext.of(PatchType.JSON_MERGE), json.writeValueAsString(patch));
        removed.addAll(ids);
        LOG.info("podalloc: removal {} of executors {} from {} (spec.replicas = {})", request, ids, setName, replicas);
        return replicas;
      } catch (KubernetesClientException e) {
        if (e.getCode() != 409 || attempt >= CONFLICT_RETRIES) {
          throw e;
        }
      }
    }
  }

  @Override
  public void stop(String applicationId) {
    writer.shutdownNow();
    List<ProfileSet> all;
    synchronized (this) {
      all = new ArrayList<>(profiles.values());
    }
    for (ProfileSet p : all) {
      if (!p.ready) {
        continue;
      }
      try {
        ObjectNode patch = json.createObjectNode();
        patch.putObject("spec").put("replicas", 0);
        set(p.name).patch(PatchContext.of(PatchType.JSON_MERGE), json.writeValueAsString(patch));
      } catch (Exception e) {
        LOG.warn("podalloc: setting ExecutorSet {}/{} to 0 at stop failed: {}", namespace, p.name, e.toString());
      }
    }
    try {
      client
          .pods()
          .inNamespace(namespace)
          .withLabel("spark-app-selector", applicationId)
          .withLabel("spark-role", "executor")
          .delete();
    } catch (Exception e) {
      LOG.warn("podalloc: deleting the executors of {} at stop failed: {}", applicationId, e.toString());
    }
  }
}
