package bootseer;

import java.io.BufferedReader;
import java.io.File;
import java.io.IOException;
import java.io.InputStreamReader;
import java.net.InetSocketAddress;
import java.lang.reflect.Method;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.locks.LockSupport;

import org.apache.hadoop.conf.Configurable;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hdfs.MiniDFSCluster;
import org.apache.hadoop.hdfs.server.datanode.DataNode;
import org.apache.hadoop.hdfs.util.Canceler;
import org.apache.hadoop.hdfs.util.DataTransferThrottler;
import org.apache.hadoop.net.StandardSocketFactory;

/**
 * A MiniDFSCluster for tests and benchmarks: a NameNode on 127.0.0.1 and N DataNodes,
 * DataNode i on loopback address 127.0.1.(i+1), WebHDFS on. Prints one JSON line once
 * it serves:
 * {"event": "ready", "namenode_rpc": P, "namenode_http": P,
 *  "datanodes": [{"host": IP, "xfer": P, "http": P}, ...]}.
 *
 * Why an address per DataNode: the NameNode knows a DataNode, and a client, by the
 * source address of its RPC connection. With every DataNode at 127.0.0.1, the DFSClient
 * inside a DataNode that serves a WebHDFS OPEN looks to the NameNode like any of them,
 * so the replica it reads is a random one, not its own: a reader cannot choose which
 * DataNode's disk serves a stripe. Here each DataNode listens on its own address and
 * every socket it opens (its NameNode RPC, its WebHDFS DFSClient, its block transfers)
 * is bound to that address by {@link BoundSocketFactory}, so the NameNode sorts the
 * DataNode's own replica first, as on a real cluster. Linux routes all of 127/8 to lo.
 *
 * Then reads commands on stdin, one per line: "stop-datanode XFER" stops the DataNode
 * whose data-transfer port is XFER and answers {"event": "stopped", "xfer": XFER}.
 * Stdin closed or SIGTERM: shut down.
 *
 * Arguments: BASE_DIR [DATANODES [READ_BYTES_PER_SEC [BLOCK_SIZE [HOSTS]]]]; a read cap of
 * 0 is none.
 *
 * Or one DataNode in a JVM of its own, joining a cluster started with 0 DataNodes, so
 * that a test can kill it with SIGKILL: --datanode BASE_DIR NAMENODE_RPC_PORT INDEX
 * READ_BYTES_PER_SEC. It prints {"event": "ready", "host": IP, "xfer": P, "http": P}
 * once registered, and serves until killed.
 */
public final class Launcher {
    private Launcher() {}

    public static void main(String[] args) throws Exception {
        if (args.length > 0 && args[0].equals("--datanode")) {
            runDataNode(args[1], Integer.parseInt(args[2]), Integer.parseInt(args[3]),
                        Long.parseLong(args[4]));
            return;
        }
        String base = args[0];
        int datanodes = args.length > 1 ? Integer.parseInt(args[1]) : 3;
        long readCap = args.length > 2 ? Long.parseLong(args[2]) : 0L;
        long blockSize = args.length > 3 ? Long.parseLong(args[3]) : 0L;
        // The address of the NameNode's HTTP (WebHDFS) server, then each DataNode's, for
        // clients elsewhere (a testbed's nodes); default 127.0.0.1 and 127.0.1.(i+1).
        String[] hosts = args.length > 4 ? args[4].split(",") : new String[0];
        String nameNodeHost = hosts.length > 0 ? hosts[0] : "127.0.0.1";

        Configuration conf = new Configuration();
        conf.set(MiniDFSCluster.HDFS_MINIDFS_BASEDIR, new File(base).getAbsolutePath());
        conf.setBoolean("dfs.webhdfs.enabled", true);
        conf.set("dfs.namenode.http-address", "127.0.0.1:0");
        conf.set("dfs.namenode.http-bind-host", nameNodeHost);  // MiniDFSCluster sets the other
        conf.set("dfs.namenode.rpc-bind-host", "127.0.0.1");  // its clients: ours, local
        conf.setBoolean("dfs.namenode.datanode.registration.ip-hostname-check", false);
        // Set here, not in the per-DataNode overlays: MiniDFSCluster sets these keys on this
        // configuration, and a key set on it hides any overlay's. The variable is each
        // overlay's own address (see addressPerDataNode).
        // Its default, for the NameNode, is a resource: an overlay's resource overrides it.
        Configuration defaults = new Configuration(false);
        defaults.set(BoundSocketFactory.BIND_KEY, "127.0.0.1");
        conf.addResource(defaults);
        String own = "${" + BoundSocketFactory.BIND_KEY + "}";
        conf.set("dfs.datanode.hostname", own);
        conf.set("dfs.datanode.address", own + ":0");
        conf.set("dfs.datanode.http.address", own + ":0");
        conf.set("dfs.datanode.ipc.address", own + ":0");
        conf.setBoolean("dfs.permissions.enabled", true);
        // Small files in tests still spread over several blocks and DataNodes.
        conf.setLong("dfs.namenode.fs-limits.min-block-size", 1024L * 1024L);
        if (blockSize > 0) {
            conf.setLong("dfs.blocksize", blockSize);
        }
        // A killed DataNode is declared dead soon, so tests need not wait ten minutes.
        conf.setInt("dfs.namenode.heartbeat.recheck-interval", 3000);
        conf.setInt("dfs.heartbeat.interval", 1);

        MiniDFSCluster cluster = new MiniDFSCluster.Builder(conf)
                .numDataNodes(datanodes)
                .nameNodePort(0)
                .nameNodeHttpPort(0)
                .checkDataNodeAddrConfig(true)
                .checkDataNodeHostConfig(true)
                .dataNodeConfOverlays(addressPerDataNode(datanodes, hosts))
                .build();
        cluster.waitActive();
        for (DataNode dn : cluster.getDataNodes()) {
            paceReads(dn, readCap);
        }
        Runtime.getRuntime().addShutdownHook(new Thread(cluster::shutdown));

        StringBuilder json = new StringBuilder();
        json.append("{\"event\": \"ready\", \"namenode_rpc\": ").append(cluster.getNameNodePort())
            .append(", \"namenode_http\": ").append(cluster.getNameNode().getHttpAddress().getPort())
            .append(", \"datanodes\": [");
        List<DataNode> nodes = new ArrayList<>(cluster.getDataNodes());
        for (int i = 0; i < nodes.size(); i++) {
            DataNode dn = nodes.get(i);
            json.append(i == 0 ? "" : ", ")
                .append("{\"host\": \"").append(dn.getXferAddress().getAddress().getHostAddress())
                .append("\", \"xfer\": ").append(dn.getXferAddress().getPort())
                .append(", \"http\": ").append(dn.getInfoPort()).append("}");
        }
        json.append("]}");
        System.out.println(json);
        System.out.flush();

        BufferedReader in = new BufferedReader(
                new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            String[] words = line.trim().split("\\s+");
            if (words.length == 2 && words[0].equals("stop-datanode")) {
                int xfer = Integer.parseInt(words[1]);
                boolean stopped = false;
                List<DataNode> running = cluster.getDataNodes();
                for (int i = 0; i < running.size() && !stopped; i++) {
                    if (running.get(i).getXferAddress().getPort() == xfer) {
                        stopped = cluster.stopDataNode(i) != null;
                    }
                }
                System.out.println("{\"event\": \"stopped\", \"xfer\": " + xfer
                        + ", \"found\": " + stopped + "}");
                System.out.flush();
            }
        }
        System.exit(0);
    }

    /** One DataNode in this JVM, on loopback address 127.0.1.(index+1), joining the NameNode
     *  at 127.0.0.1:nameNodePort; prints its ready line, then serves until killed. */
    private static void runDataNode(String base, int nameNodePort, int index, long readCap)
            throws Exception {
        String host = "127.0.1." + (index + 1);
        Configuration conf = new Configuration();
        conf.set("fs.defaultFS", "hdfs://127.0.0.1:" + nameNodePort);
        conf.set("dfs.datanode.data.dir", new File(base, "dn-" + index).getAbsolutePath());
        conf.set("dfs.datanode.hostname", host);
        conf.set("dfs.datanode.address", host + ":0");
        conf.set("dfs.datanode.http.address", host + ":0");
        conf.set("dfs.datanode.ipc.address", host + ":0");
        conf.setBoolean("dfs.webhdfs.enabled", true);
        conf.setInt("dfs.heartbeat.interval", 1);
        conf.set("hadoop.rpc.socket.factory.class.default", BoundSocketFactory.class.getName());
        conf.set("hadoop.rpc.socket.factory.class.ClientProtocol",
                 BoundSocketFactory.class.getName());
        conf.set(BoundSocketFactory.BIND_KEY, host);
        DataNode dn = DataNode.createDataNode(new String[0], conf);
        while (!dn.isDatanodeFullyStarted()) {
            Thread.sleep(100);
        }
        paceReads(dn, readCap);
        System.out.println("{\"event\": \"ready\", \"host\": \"" + host + "\", \"xfer\": "
                + dn.getXferAddress().getPort() + ", \"http\": " + dn.getInfoPort() + "}");
        System.out.flush();
        Thread.currentThread().join();  // its threads serve; this one waits for the kill
    }

    /** Caps the DataNode's block reads at `readCap` bytes/s (none if 0) with a
     *  {@link DiskPacer} in the place of the read throttler that
     *  `dfs.datanode.data.read.bandwidthPerSec` would install. */
    private static void paceReads(DataNode dn, long readCap) throws Exception {
        if (readCap > 0) {
            // DataXceiverServer is package-private: its public setter is reached by reflection.
            Object server = dn.getXferServer();
            Method set = server.getClass().getMethod("setReadThrottler",
                                                     DataTransferThrottler.class);
            set.setAccessible(true);
            set.invoke(server, new DiskPacer(readCap));
        }
    }

    /**
     * A DataNode's reads paced as a disk of `bytesPerSec` would serve them: each packet
     * sent holds the "disk" for its bytes / bytesPerSec, packets of all streams one after
     * another, and an idle disk saves up nothing.
     *
     * Why not Hadoop's own DataTransferThrottler (what the bandwidthPerSec key installs):
     * it grants bytes per 500 ms period and keeps unused grant for up to 1.5 s, so a
     * DataNode that was idle serves its next stream's first ~10-15 MB at once. One
     * sequential stream moves to a fresh DataNode at every block and got that burst
     * each time (1 GiB at a 20 MB/s cap: 21.6 MB/s), while a DataNode kept busy got
     * 16.8 MB/s: the baseline looked 1.29x faster than the disk it stands for.
     *
     * An idle moment shorter than SLACK_NANOS is not lost: a packet's own send time
     * overlaps the disk time of the next, as a disk's read-ahead would (without it one
     * stream ran 5 % under the cap).
     */
    public static final class DiskPacer extends DataTransferThrottler {
        private static final long SLACK_NANOS = 20_000_000L;
        private final double nanosPerByte;
        private long nextFree = System.nanoTime();  // when the "disk" is next idle

        DiskPacer(long bytesPerSec) {
            super(bytesPerSec);
            nanosPerByte = 1e9 / bytesPerSec;
        }

        @Override
        public void throttle(long numOfBytes) {
            throttle(numOfBytes, null);
        }

        @Override
        public void throttle(long numOfBytes, Canceler canceler) {
            long until;
            synchronized (this) {
                nextFree = Math.max(nextFree, System.nanoTime() - SLACK_NANOS)
                        + (long) (numOfBytes * nanosPerByte);
                until = nextFree;
            }
            long left;
            while ((left = until - System.nanoTime()) > 0) {
                if (canceler != null && canceler.isCancelled()) {
                    return;
                }
                LockSupport.parkNanos(left);
            }
        }
    }

    /** One configuration per DataNode: its own loopback address for every port it
     *  listens on and every socket it opens. */
    private static Configuration[] addressPerDataNode(int datanodes, String[] hosts) {
        Configuration[] overlays = new Configuration[datanodes];
        for (int i = 0; i < datanodes; i++) {
            String host = i + 1 < hosts.length ? hosts[i + 1] : "127.0.1." + (i + 1);
            Configuration c = new Configuration(false);
            c.set("hadoop.rpc.socket.factory.class.default", BoundSocketFactory.class.getName());
            c.set("hadoop.rpc.socket.factory.class.ClientProtocol",
                  BoundSocketFactory.class.getName());
            c.set(BoundSocketFactory.BIND_KEY, host);
            overlays[i] = c;
        }
        return overlays;
    }

    /** Sockets bound to the address in `bootseer.bind.address` before they connect.
     *  Hadoop caches one IPC client per equal factory, so equality includes the address. */
    public static final class BoundSocketFactory extends StandardSocketFactory
            implements Configurable {
        static final String BIND_KEY = "bootseer.bind.address";
        private Configuration conf;
        private String host = "127.0.0.1";

        @Override
        public void setConf(Configuration c) {
            conf = c;
            host = c.get(BIND_KEY, host);
        }

        @Override
        public Configuration getConf() {
            return conf;
        }

        @Override
        public Socket createSocket() throws IOException {
            Socket socket = super.createSocket();
            socket.bind(new InetSocketAddress(host, 0));
            return socket;
        }

        @Override
        public boolean equals(Object other) {
            return other instanceof BoundSocketFactory
                    && ((BoundSocketFactory) other).host.equals(host);
        }

        @Override
        public int hashCode() {
            return host.hashCode();
        }
    }
}
