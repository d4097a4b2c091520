// Test workload: two named hot methods; hotHeavy does 3x the work of hotLight per call.
// Run: java -XX:+UnlockDiagnosticVMOptions -XX:+DumpPerfMapAtExit -XX:+PreserveFramePointer
//      -XX:CompileCommand=dontinline,Burn::hot* Burn SECONDS
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
        long end = System.nanoTime() + (long) (seconds * 1e9);
        int acc = 0;
        while (System.nanoTime() < end) {
            acc ^= hotHeavy(300000);
            acc ^= hotLight(300000);
        }
        System.out.println(acc);
    }
}
