package podalloc.sparkapp;

import java.util.ArrayList;
import java.util.List;
import java.util.TreeMap;
import org.apache.spark.SparkConf;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.functions;

/**
 * The Spark application of scripts/spark-app.sh: a driver (client mode) running a two-phase
 * job with dynamic allocation. Each phase is wide (16 tasks sleeping 1.5 s each, so the
 * allocation manager asks for more executors), then a sum over 10^7 rows and a groupBy with a
 * shuffle; between the phases the driver sits idle for {@code podalloc.app.gapSeconds}
 * (default 30), longer than the executor idle timeout, so executors are released and phase
 * two needs new ones.
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
    String result;
    try {
      event("phase1-start");
      String one = phase(spark);
      event("phase1-end");
      Thread.sleep(gapMs);
      event("phase2-start");
      String two = phase(spark);
      event("phase2-end");
      result = one + ";" + two;
    } finally {
      spark.stop();
    }
    String expected = expectedPhase() + ";" + expectedPhase();
    System.out.println("podalloc-spark-app: result=" + result + " expected=" + expected);
    System.exit(result.equals(expected) ? 0 : 1);
  }

  private static void event(String name) {
    System.out.println("podalloc-spark-app: event=" + name + " at=" + System.currentTimeMillis());
    System.out.flush();
  }

  /** One phase's answer: wide sum / sum of 1..10^7 / the group counts. */
  private static String phase(SparkSession spark) {
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
    return wide + "/" + sum + "/" + groups.toString().replace(" ", "");
  }

  /** The same answers computed without Spark. */
  private static String expectedPhase() {
    long wide = 0;
    for (long i = 0; i < WIDE_TASKS; i++) {
      wide += i * i;
    }
    long sum = SUM_TO * (SUM_TO + 1) / 2;
    TreeMap<Long, Long> groups = new TreeMap<>();
    for (long i = 0; i < GROUP_ROWS; i++) {
      groups.merge(i % GROUPS, 1L, Long::sum);
    }
    return wide + "/" + sum + "/" + groups.toString().replace(" ", "");
  }
}
