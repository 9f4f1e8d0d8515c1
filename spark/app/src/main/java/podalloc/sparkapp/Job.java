package podalloc.sparkapp;

import java.util.ArrayList;
import java.util.List;
import java.util.TreeMap;
import java.util.TreeSet;
import org.apache.spark.SparkConf;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.resource.ExecutorResourceRequests;
import org.apache.spark.resource.ResourceProfile;
import org.apache.spark.resource.ResourceProfileBuilder;
import org.apache.spark.resource.TaskResourceRequests;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.functions;

/**
 * The Spark application of scripts/spark-app.sh: a driver (client mode) running a two-phase
 * job with dynamic allocation. Each phase is wide (16 tasks sleeping 1.5 s each, so the
 * allocation manager asks for more executors), then a sum over 10^7 rows and a groupBy with a
 * shuffle, then (unless {@code podalloc.app.secondProfile=false}) a stage of 4 tasks sleeping
 * 1.5 s each in a second resource profile (stage-level scheduling: executors of 2 cores and
 * 640m, tasks of 1 cpu), whose tasks report the {@code SPARK_RESOURCE_PROFILE_ID} of the
 * executor that ran them; between the phases the driver sits idle for {@code
 * podalloc.app.gapSeconds} (default 30), longer than the executor idle timeout, so executors
 * are released and phase two needs new ones.
 *
 * <p>Arguments are {@code key=value} Spark settings (master, namespace, authentication,
 * allocator, ...). It prints, on stdout, {@code podalloc-spark-app: event=NAME at=EPOCH_MS}
 * for session-ready, phase1-start, phase1-end, phase2-start and phase2-end, then {@code
 * podalloc-spark-app: result=X expected=X}, X being both phases' answers and the expected
 * one computed here without Spark.
 */
public final class Job {
  private static final int WIDE_TASKS = 16;
  private static final long SUM_TO = 10_000_000L;
  private static final int GROUP_ROWS = 1000;
  private static final int GROUPS = 7;
  private static final int PROFILE_TASKS = 4;

  private Job() {}

  public static void main(String[] args) throws Exception {
    SparkConf conf = new SparkConf();
    for (String a : args) {
      int i = a.indexOf('=');
      if (i <= 0) {
        throw new IllegalArgumentException("expected key=value, got " + a);
      }
      conf.set(a.substring(0, i), a.substring(i + 1));
    }
    long gapMs = (long) (Double.parseDouble(conf.get("podalloc.app.gapSeconds", "30")) * 1000);
    SparkSession spark = SparkSession.builder().config(conf).getOrCreate();
    event("session-ready");
    ResourceProfile second =
        conf.getBoolean("podalloc.app.secondProfile", true)
            ? new ResourceProfileBuilder()
                .require(new ExecutorResourceRequests().cores(2).memory("640m"))
                .require(new TaskResourceRequests().cpus(1))
                .build()
            : null;
    String result;
    try {
      event("phase1-start");
      String one = phase(spark, second);
      event("phase1-end");
      Thread.sleep(gapMs);
      event("phase2-start");
      String two = phase(spark, second);
      event("phase2-end");
      result = one + ";" + two;
    } finally {
      spark.stop();
    }
    String expected = expectedPhase(second) + ";" + expectedPhase(second);
    System.out.println("podalloc-spark-app: result=" + result + " expected=" + expected);
    System.exit(result.equals(expected) ? 0 : 1);
  }

  private static void event(String name) {
    System.out.println("podalloc-spark-app: event=" + name + " at=" + System.currentTimeMillis());
    System.out.flush();
  }

  /**
   * One phase's answer: wide sum / sum of 1..10^7 / the group counts, then with a {@code
   * second} profile / rpID: the resource profile ids its tasks ran under (distinct, sorted).
   */
  private static String phase(SparkSession spark, ResourceProfile second) {
    JavaSparkContext jsc = JavaSparkContext.fromSparkContext(spark.sparkContext());
    List<Integer> ids = new ArrayList<>();
    for (int i = 0; i < WIDE_TASKS; i++) {
      ids.add(i);
    }
    long wide =
        jsc.parallelize(ids, WIDE_TASKS)
            .map(
                i -> {
                  Thread.sleep(1500);
                  return (long) i * i;
                })
            .reduce(Long::sum);
    long sum = spark.range(1, SUM_TO + 1, 1, 8).agg(functions.sum("id")).first().getLong(0);
    TreeMap<Long, Long> groups = new TreeMap<>();
    for (Row r :
        spark
            .range(0, GROUP_ROWS, 1, 8)
            .groupBy(functions.col("id").mod(GROUPS).alias("g"))
            .count()
            .collectAsList()) {
      groups.put(r.getLong(0), r.getLong(1));
    }
    String answer = wide + "/" + sum + "/" + groups.toString().replace(" ", "");
    if (second == null) {
      return answer;
    }
    TreeSet<String> ran =
        new TreeSet<>(
            jsc.parallelize(ids.subList(0, PROFILE_TASKS), PROFILE_TASKS)
                .withResources(second)
                .map(
                    i -> {
                      Thread.sleep(1500);
                      return String.valueOf(System.getenv("SPARK_RESOURCE_PROFILE_ID"));
                    })
                .collect());
    return answer + "/rp" + second.id() + ":" + String.join(",", ran);
  }

  /** The same answers computed without Spark: the second profile's tasks all ran under it. */
  private static String expectedPhase(ResourceProfile second) {
    long wide = 0;
    for (long i = 0; i < WIDE_TASKS; i++) {
      wide += i * i;
    }
    long sum = SUM_TO * (SUM_TO + 1) / 2;
    TreeMap<Long, Long> groups = new TreeMap<>();
    for (long i = 0; i < GROUP_ROWS; i++) {
      groups.merge(i % GROUPS, 1L, Long::sum);
    }
    String answer = wide + "/" + sum + "/" + groups.toString().replace(" ", "");
    return second == null ? answer : answer + "/rp" + second.id() + ":" + second.id();
  }
}
