package podalloc.sparkapp;

import org.apache.spark.launcher.JavaModuleOptions;

/**
 * Prints the Java options spark-submit gives a driver on Java 17+ ({@code --add-opens} and
 * the rest, from spark-launcher's {@code JavaModuleOptions}), so scripts/spark-app.sh starts
 * the driver as spark-submit would without spark-submit.
 */
public final class ModuleOptions {
  private ModuleOptions() {}

  public static void main(String[] args) {
    System.out.println(JavaModuleOptions.defaultModuleOptions());
  }
}
