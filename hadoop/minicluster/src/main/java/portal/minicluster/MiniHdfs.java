package portal.minicluster;

import java.io.File;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.CountDownLatch;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hdfs.HdfsConfiguration;
import org.apache.hadoop.hdfs.MiniDFSCluster;
import org.apache.hadoop.security.UserGroupInformation;

/**
 * A NameNode and a DataNode in this JVM, on 127.0.0.1 only, with WebHDFS and
 * permission checks on, and the portal's service user allowed to act for
 * others (doas) and made an HDFS superuser (group "supergroup").
 *
 * <pre>
 * java -cp target/classes:$(cat target/classpath.txt) portal.minicluster.MiniHdfs \
 *     --rpc-port 9000 --http-port 9870 --base-dir DIR --proxy-user pai [--parent-pid PID]
 * </pre>
 *
 * Prints one line "MINIHDFS READY rpc=... webhdfs=..." once WebHDFS answers;
 * SIGTERM shuts both servers down. DIR keeps the file system between runs
 * (formatted only when it holds none), so a restart finds its files again.
 * With --parent-pid it also stops when that process is gone (a test run
 * killed before it could stop us).
 */
public final class MiniHdfs {

    public static void main(String[] args) throws Exception {
        Map<String, String> options = parse(args);
        int rpcPort = Integer.parseInt(required(options, "rpc-port"));
        int httpPort = Integer.parseInt(required(options, "http-port"));
        File baseDir = new File(required(options, "base-dir")).getAbsoluteFile();
        String proxyUser = options.getOrDefault("proxy-user", "pai");

        Configuration conf = new HdfsConfiguration();
        conf.set(MiniDFSCluster.HDFS_MINIDFS_BASEDIR, baseDir.getPath());
        conf.setBoolean("dfs.webhdfs.enabled", true);
        conf.setBoolean("dfs.permissions.enabled", true);
        conf.set("fs.permissions.umask-mode", "022");
        conf.setInt("dfs.replication", 1);
        // Out of safe mode as soon as the DataNode has reported, after a restart too.
        conf.setInt("dfs.namenode.safemode.extension", 0);
        // The portal's service user may act for any user, from this machine only.
        conf.set("hadoop.proxyuser." + proxyUser + ".hosts", "127.0.0.1");
        conf.set("hadoop.proxyuser." + proxyUser + ".groups", "*");
        // Users need not exist on this machine: groups come from here, not the OS.
        conf.set("dfs.permissions.superusergroup", "supergroup");
        conf.set("hadoop.user.group.static.mapping.overrides", "dr.who=;" + proxyUser + "=supergroup");
        // MiniDFSCluster puts the NameNode on 127.0.0.1 and the DataNode on 127.0.0.1:0.
        conf.set("dfs.namenode.rpc-bind-host", "127.0.0.1");
        conf.set("dfs.namenode.http-bind-host", "127.0.0.1");
        // Closing a file (WebHDFS CREATE's last step, run by a DFSClient in the
        // DataNode) races the DataNode's report of the last block: when the
        // NameNode has not had it yet ("COMMITTED but not COMPLETE" in its
        // log), the client sleeps the initial delay, 400 ms by default, and
        // asks again. That was 0.4 s on about half of the uploads here, on a
        // transfer that takes about 1 s. With 25 ms it asks again soon; 10
        // retries (25 ms doubling) still wait up to 25 s in all, longer than
        // the default's 5 (12 s), for a busy machine.
        conf.setInt("dfs.client.block.write.locateFollowingBlock.initial.delay.ms", 25);
        conf.setInt("dfs.client.block.write.locateFollowingBlock.retries", 10);
        // Permission checks resolve groups through UGI's own configuration.
        UserGroupInformation.setConfiguration(conf);

        boolean fresh = !new File(baseDir, "name-0-1/current").isDirectory();
        MiniDFSCluster cluster = new MiniDFSCluster.Builder(conf)
                .nameNodePort(rpcPort)
                .nameNodeHttpPort(httpPort)
                .numDataNodes(1)
                .format(fresh)
                .build();
        cluster.waitActive();
        // After a restart the NameNode stays in safe mode (read-only) until the
        // DataNode has reported its blocks: ready means writable.
        while (cluster.getNameNode().isInSafeMode()) {
            Thread.sleep(100);
        }

        CountDownLatch stopped = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            System.out.println("MINIHDFS STOPPING");
            cluster.shutdown();
            stopped.countDown();
        }));
        System.out.println("MINIHDFS READY rpc=hdfs://127.0.0.1:" + rpcPort
                + " webhdfs=http://127.0.0.1:" + httpPort + " formatted=" + fresh);
        System.out.flush();
        if (options.containsKey("parent-pid")) {
            watchParent(Long.parseLong(options.get("parent-pid")));
        }
        stopped.await();
    }

    private static void watchParent(long pid) {
        Thread watcher = new Thread(() -> {
            while (ProcessHandle.of(pid).map(ProcessHandle::isAlive).orElse(false)) {
                try {
                    Thread.sleep(1000);
                } catch (InterruptedException e) {
                    return;
                }
            }
            System.exit(0);  // runs the shutdown hook
        }, "parent-watcher");
        watcher.setDaemon(true);
        watcher.start();
    }

    private static Map<String, String> parse(String[] args) {
        Map<String, String> options = new HashMap<>();
        for (int i = 0; i + 1 < args.length; i += 2) {
            if (!args[i].startsWith("--")) {
                throw new IllegalArgumentException("expected --name value, got " + args[i]);
            }
            options.put(args[i].substring(2), args[i + 1]);
        }
        return options;
    }

    private static String required(Map<String, String> options, String name) {
        String value = options.get(name);
        if (value == null) {
            throw new IllegalArgumentException("missing --" + name);
        }
        return value;
    }
}
