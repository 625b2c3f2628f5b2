import java.io.FileInputStream;
import java.io.FileOutputStream;
import java.io.InputStream;
import java.io.OutputStream;
import java.security.KeyStore;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.util.Collection;

/**
 * Writes a PEM bundle of CA certificates (the system's, which curl and pip trust) as a
 * PKCS12 trust store, so that Maven trusts the same authorities: Java keeps a trust
 * store of its own, which on some machines lacks authorities the system has.
 * Usage: java PemTrustStore.java BUNDLE.pem OUT.p12 PASSWORD
 */
public class PemTrustStore {
    public static void main(String[] args) throws Exception {
        Collection<? extends Certificate> certs;
        try (InputStream in = new FileInputStream(args[0])) {
            certs = CertificateFactory.getInstance("X.509").generateCertificates(in);
        }
        KeyStore store = KeyStore.getInstance("PKCS12");
        store.load(null, null);
        int count = 0;
        for (Certificate cert : certs) {
            store.setCertificateEntry("ca-" + count++, cert);
        }
        try (OutputStream out = new FileOutputStream(args[1])) {
            store.store(out, args[2].toCharArray());
        }
        System.out.println(count);
    }
}
