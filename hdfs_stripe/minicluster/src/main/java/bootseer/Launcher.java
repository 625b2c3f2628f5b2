package bootseer;

import java.io.BufferedReader;
import java.io.File;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hdfs.MiniDFSCluster;
import org.apache.hadoop.hdfs.server.datanode.DataNode;

/**
 * A MiniDFSCluster for tests and benchmarks: one NameNode and N DataNodes on 127.0.0.1,
 * WebHDFS on. Prints one JSON line once it serves:
 * {"event": "ready", "namenode_rpc": P, "namenode_http": P,
 *  "datanodes": [{"xfer": P, "http": P}, ...]}.
 * Then reads commands on stdin, one per line: "stop-datanode XFER" stops the DataNode
 * whose data-transfer port is XFER and answers {"event": "stopped", "xfer": XFER}.
 * Stdin closed or SIGTERM: shut down.
 *
 * Arguments: BASE_DIR [DATANODES [READ_BYTES_PER_SEC [BLOCK_SIZE]]]; a read cap of 0 is none.
 */
public final class Launcher {
    private Launcher() {}

    public static void main(String[] args) throws Exception {
        String base = args[0];
        int datanodes = args.length > 1 ? Integer.parseInt(args[1]) : 3;
        long readCap = args.length > 2 ? Long.parseLong(args[2]) : 0L;
        long blockSize = args.length > 3 ? Long.parseLong(args[3]) : 0L;

        Configuration conf = new Configuration();
        conf.set(MiniDFSCluster.HDFS_MINIDFS_BASEDIR, new File(base).getAbsolutePath());
        conf.setBoolean("dfs.webhdfs.enabled", true);
        conf.set("dfs.namenode.http-address", "127.0.0.1:0");
        conf.set("dfs.namenode.rpc-bind-host", "127.0.0.1");
        conf.setBoolean("dfs.permissions.enabled", true);
        // Small files in tests still spread over several blocks and DataNodes.
        conf.setLong("dfs.namenode.fs-limits.min-block-size", 1024L * 1024L);
        if (blockSize > 0) {
            conf.setLong("dfs.blocksize", blockSize);
        }
        if (readCap > 0) {
            conf.setLong("dfs.datanode.data.read.bandwidthPerSec", readCap);
        }
        // A killed DataNode is declared dead soon, so tests need not wait ten minutes.
        conf.setInt("dfs.namenode.heartbeat.recheck-interval", 3000);
        conf.setInt("dfs.heartbeat.interval", 1);

        MiniDFSCluster cluster = new MiniDFSCluster.Builder(conf)
                .numDataNodes(datanodes)
                .nameNodePort(0)
                .nameNodeHttpPort(0)
                .checkDataNodeAddrConfig(false)
                .build();
        cluster.waitActive();
        Runtime.getRuntime().addShutdownHook(new Thread(cluster::shutdown));

        StringBuilder json = new StringBuilder();
        json.append("{\"event\": \"ready\", \"namenode_rpc\": ").append(cluster.getNameNodePort())
            .append(", \"namenode_http\": ").append(cluster.getNameNode().getHttpAddress().getPort())
            .append(", \"datanodes\": [");
        List<DataNode> nodes = new ArrayList<>(cluster.getDataNodes());
        for (int i = 0; i < nodes.size(); i++) {
            DataNode dn = nodes.get(i);
            json.append(i == 0 ? "" : ", ")
                .append("{\"xfer\": ").append(dn.getXferAddress().getPort())
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
                boolean stopped = cluster.stopDataNode("127.0.0.1:" + xfer) != null;
                System.out.println("{\"event\": \"stopped\", \"xfer\": " + xfer
                        + ", \"found\": " + stopped + "}");
                System.out.flush();
            }
        }
        System.exit(0);
    }
}
