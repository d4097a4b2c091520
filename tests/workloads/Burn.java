// Test workload: two named hot methods; hotHeavy does 3x the work of hotLight per call.
// Run: java -XX:+UnlockDiagnosticVMOptions -XX:+DumpPerfMapAtExit -XX:+PreserveFramePointer
//      -XX:CompileCommand=dontinline,Burn::hot* Burn SECONDS [MIN_LIGHT_S CAP_S]
// It runs SECONDS, and on until hotLight has had MIN_LIGHT_S of CPU time (a slow or loaded
// machine gives it less per second), for at most CAP_S.
// At exit it prints the thread CPU time spent in each method ("time_s HEAVY LIGHT"): the
// compiled code of the two need not run exactly 3:1 in time, so that is the truth to check.
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;

public class Burn {
    static int hotHeavy(int n) {
        int x = 1;
        for (int i = 0; i < 3 * n; i++) {
            x = x * 1103515245 + 12345;
        }
        return x;
    }

    static int hotLight(int n) {
        int x = 1;
        for (int i = 0; i < n; i++) {
            x = x * 1103515245 + 12345;
        }
        return x;
    }

    public static void main(String[] args) {
        double seconds = args.length > 0 ? Double.parseDouble(args[0]) : 2.0;
        ThreadMXBean threads = ManagementFactory.getThreadMXBean();
        double minLight = args.length > 1 ? Double.parseDouble(args[1]) : 0.0;
        double capSeconds = args.length > 2 ? Double.parseDouble(args[2]) : seconds;
        long start = System.nanoTime();
        long end = start + (long) (seconds * 1e9);
        long cap = start + (long) (capSeconds * 1e9);
        long heavyNs = 0;
        long lightNs = 0;
        int acc = 0;
        while ((System.nanoTime() < end || lightNs < minLight * 1e9) && System.nanoTime() < cap) {
            long t0 = threads.getCurrentThreadCpuTime();
            acc ^= hotHeavy(300000);
            long t1 = threads.getCurrentThreadCpuTime();
            acc ^= hotLight(300000);
            long t2 = threads.getCurrentThreadCpuTime();
            heavyNs += t1 - t0;
            lightNs += t2 - t1;
        }
        System.out.println(acc);
        System.out.println("time_s " + heavyNs / 1e9 + " " + lightNs / 1e9);
    }
}
