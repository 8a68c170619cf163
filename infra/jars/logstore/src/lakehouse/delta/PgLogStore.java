package lakehouse.delta;

import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.OutputStream;
import java.net.URI;
import java.net.URISyntaxException;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.FileSystemException;
import java.sql.Array;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedDeque;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;

import io.delta.storage.HadoopFileSystemLogStore;
import io.delta.storage.internal.FileNameUtils;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The Delta log store of the lakehouse's s3a:// tables: a commit lands only if its writer still
 * holds its writer lock (a PostgreSQL advisory lock, lakehouse/tables/locks.py), decided inside
 * the lock server's transaction that is the commit point.
 *
 * <p>The commit protocol is Delta's external-log-store algorithm (the one of
 * {@code io.delta.storage.BaseExternalLogStore} in delta-storage-s3-dynamodb, written again here
 * because that artifact is not on the project's Maven registry): to write version N,
 * <ol>
 *   <li>fail if N.json exists; make sure N-1 is complete (repair it, below);</li>
 *   <li>write the actions to a temporary file {@code _delta_log/.tmp/N.json.<uuid>};</li>
 *   <li>insert the entry (table, N.json, temp file, complete=false) into
 *       {@code lakehouse_delta_commits}, whose primary key (table, file) makes it put-if-absent:
 *       <b>the commit point</b>. A key conflict is {@link FileAlreadyExistsException}, which
 *       Delta turns into its conflict check and a retry at the next version;</li>
 *   <li>write N.json (the same bytes), mark the entry complete.</li>
 * </ol>
 * A reader or writer that finds the newest entry incomplete (a writer that died or paused after
 * its commit point) copies its temporary file to N.json and marks it complete ({@code listFrom}),
 * as the original does.
 *
 * <p>The fence, in the same transaction as the insert: for each lock the writer holds (the
 * session configuration {@code spark.lakehouse.fence.<table path>} = {@code key:pid:start[,...]},
 * set by spark_jobs/writer.py around each commit: the lock's key, its holder's backend pid and
 * backend start in microseconds), it takes {@code pg_advisory_xact_lock_shared(hi, lo)} (the
 * two-int advisory lock made of the key's halves) and then requires the advisory lock `key` to
 * be granted to that backend, started at that time (a reused pid is another backend). Otherwise
 * nothing is inserted and the commit fails with "WriterLockLost". A new holder, once it has
 * the advisory lock, takes {@code pg_advisory_xact_lock(hi, lo)} exclusively: it waits for every
 * commit transaction of the old holder in flight, so a commit whose check passed lands before
 * the takeover returns, and every check after it fails.
 *
 * <p>A commit whose session sets no fence for its table (a table's creation, VACUUM's entries
 * of a daily table, a job outside the lock scheme) is put-if-absent only, as every commit of the
 * original: it never overwrites another, and Delta's conflict checks decide the rest. Files
 * other than N.json are written as the single-driver S3 log store writes them.
 *
 * <p>The lock server: {@code spark.lakehouse.lockServer.url} (a JDBC URL without credentials),
 * {@code .user} and {@code .password}, from the Spark configuration (the password through the
 * owner-only properties file, never a command line). Entries of completed commits are deleted
 * a day after (the original's expiry: a writer that saw no N.json before N was written is still
 * refused by the key for that long).
 */
public class PgLogStore extends HadoopFileSystemLogStore {
    private static final Logger LOG = LoggerFactory.getLogger(PgLogStore.class);

    public static final String FENCE_PREFIX = "spark.lakehouse.fence.";
    public static final String URL_KEY = "spark.lakehouse.lockServer.url";
    public static final String USER_KEY = "spark.lakehouse.lockServer.user";
    public static final String PASSWORD_KEY = "spark.lakehouse.lockServer.password";
    public static final String TABLE = "lakehouse_delta_commits";
    /** Seconds a completed entry is kept. */
    public static final long RETENTION_S = 24 * 3600;
    /** What a refused commit's message says (the service stops a pipeline on it). */
    public static final String LOST = "WriterLockLost";

    /** A commit the lock server definitely did not take (its fence failed, or its transaction
     * was ended with no entry of its own): unlike an unknown outcome, its temporary file is
     * nobody's. */
    static final class Refused extends IOException {
        Refused(String message) {
            super(message);
        }

        Refused(String message, Throwable cause) {
            super(message, cause);
        }
    }

    static final String DDL = "CREATE TABLE IF NOT EXISTS " + TABLE + " ("
        + "table_path TEXT NOT NULL, file_name TEXT NOT NULL, temp_path TEXT NOT NULL, "
        + "complete BOOLEAN NOT NULL, expire_time BIGINT, lock_keys BIGINT[], fence TEXT, "
        + "committed_at TIMESTAMPTZ NOT NULL DEFAULT now(), "
        + "PRIMARY KEY (table_path, file_name))";
    /** The commits a new lock holder completes (lakehouse/tables/commit_log.py): few rows. */
    static final String INDEX = "CREATE INDEX IF NOT EXISTS " + TABLE + "_incomplete ON "
        + TABLE + " (table_path) WHERE NOT complete";

    private static final ExecutorService CLEANER = Executors.newSingleThreadExecutor(r -> {
        Thread t = new Thread(r, "pg-log-store-cleaner");
        t.setDaemon(true);
        return t;
    });

    public PgLogStore(Configuration initHadoopConf) {
        super(initHadoopConf);
    }

    @Override
    public Boolean isPartialWriteVisible(Path path, Configuration hadoopConf) {
        return false; // an S3 PUT is all or nothing
    }

    // ------------------------------------------------------------------------------------------
    // Reads: the newest entry completed first
    // ------------------------------------------------------------------------------------------
    @Override
    public Iterator<FileStatus> listFrom(Path path, Configuration hadoopConf) throws IOException {
        FileSystem fs = path.getFileSystem(hadoopConf);
        Path resolved = stripUserInfo(fs.makeQualified(path));
        if (resolved.getParent() != null && "_delta_log".equals(resolved.getParent().getName())) {
            String table = tablePath(resolved).toString();
            Entry latest = null;
            try {
                latest = Db.of(conf(hadoopConf)).latest(table);
            } catch (SQLException e) {
                // No lock server: the log as the store holds it (a commit whose copy is
                // pending is not seen yet; no writer commits without the server either).
                LOG.warn("lock server unreachable, listing {} without it: {}", table, e.toString());
            }
            if (latest != null && !latest.complete) {
                complete(fs, hadoopConf, latest);
            }
        }
        return super.listFrom(path, hadoopConf);
    }

    // ------------------------------------------------------------------------------------------
    // Writes
    // ------------------------------------------------------------------------------------------
    @Override
    public void write(Path path, Iterator<String> actions, Boolean overwrite,
                      Configuration hadoopConf) throws IOException {
        FileSystem fs = path.getFileSystem(hadoopConf);
        Path resolved = stripUserInfo(fs.makeQualified(path));
        if (overwrite) {
            put(fs, resolved, bytes(actions), true);
            return;
        }
        if (!FileNameUtils.isDeltaFile(resolved)) {
            if (fs.exists(resolved)) {
                throw new FileAlreadyExistsException(resolved.toString());
            }
            put(fs, resolved, bytes(actions), false);
            return;
        }
        long version = FileNameUtils.deltaVersion(resolved);
        Path logDir = resolved.getParent();
        String table = tablePath(resolved).toString();
        String fileName = resolved.getName();
        String fenceText = fenceOf(hadoopConf, table);
        List<Token> fence = Token.parseAll(fenceText);
        try {
            Db db = Db.of(conf(hadoopConf));
            // Step 0: not there yet, by the log's entry (one query with N-1's) and the store.
            String prevName = version > 0
                ? FileNameUtils.deltaFile(logDir, version - 1).getName() : null;
            Map<String, Entry> known = db.get(table, fileName, prevName);
            Entry entry = new Entry(table, fileName,
                ".tmp/" + fileName + "." + UUID.randomUUID(), false);
            String stale = null;
            if (known.containsKey(fileName)) {
                stale = version == 0 ? staleCreation(fs, known.get(fileName), resolved) : null;
                if (stale == null) {
                    throw new FileAlreadyExistsException(resolved.toString());
                }
            } else if (fs.exists(resolved)) {
                throw new FileAlreadyExistsException(resolved.toString());
            }
            // Step 1: N-1 complete.
            if (version > 0) {
                Entry prev = known.get(prevName);
                if (prev != null && !prev.complete) {
                    complete(fs, hadoopConf, prev);
                } else if (prev == null && !fs.exists(new Path(logDir, prevName))) {
                    throw new FileSystemException("previous commit " + new Path(logDir, prevName)
                        + " doesn't exist");
                }
            }
            // Step 2: the temporary file, then the entry (the commit point, fenced).
            byte[] content = bytes(actions);
            put(fs, new Path(logDir, entry.temp), content, true);
            try {
                db.insert(entry, fence, fenceText, stale);
            } catch (FileAlreadyExistsException | Refused e) {
                // Definitely not committed (the transaction rolled back or its backend ended
                // with no entry of ours): the temporary file is nobody's. Never on an unknown
                // outcome, whose entry may name it.
                CLEANER.submit(() -> deleteQuietly(fs, new Path(logDir, entry.temp)));
                throw e;
            }
            // Step 3: N.json (only the entry's bytes are ever written there: no probe of what
            // is there) and the entry completed; a failure here is left to the next reader, as
            // the commit has landed.
            try {
                put(fs, resolved, content, true);
            } catch (Throwable e) {
                LOG.warn("commit {} of {} landed; its copy is left to the next reader: {}",
                    version, table, e.toString());
                return;
            }
            try {
                db.markComplete(entry);
                CLEANER.submit(() -> deleteQuietly(fs, new Path(logDir, entry.temp)));
            } catch (Throwable e) {
                LOG.warn("commit {} of {} landed; marking it complete is left to the next "
                    + "reader: {}", version, table, e.toString());
            }
        } catch (SQLException e) {
            throw new IOException((fence.isEmpty() ? "" : LOST + ": ") + "commit " + version
                + " of " + table + " not made: the lock server cannot confirm the writer lock ("
                + e.getMessage() + ")", e);
        }
    }

    /**
     * For a creation (version 0) whose entry 0 remains from a table deleted since (its 0.json
     * gone, the entry complete or its temporary file gone): that entry's temporary path, so the
     * insert clears the old table's entries first, in its transaction, if they are still those.
     * Null when entry 0 is the table's own (it exists, or is being created).
     */
    private static String staleCreation(FileSystem fs, Entry old, Path zero) throws IOException {
        if (fs.exists(zero)) {
            return null;
        }
        if (old.complete || !fs.exists(new Path(zero.getParent(), old.temp))) {
            return old.temp;
        }
        return null;
    }

    /** Copy an incomplete entry's temporary file to its N.json (unless there) and mark it. */
    private void complete(FileSystem fs, Configuration hadoopConf, Entry entry)
            throws IOException {
        Path logDir = new Path(entry.table, "_delta_log");
        Path target = new Path(logDir, entry.fileName);
        for (int attempt = 1; ; attempt++) {
            try {
                if (!fs.exists(target)) {
                    byte[] content;
                    try (FSDataInputStream in = fs.open(new Path(logDir, entry.temp))) {
                        content = in.readAllBytes();
                    }
                    put(fs, target, content, true); // the entry's bytes, whoever writes them
                }
                Db.of(conf(hadoopConf)).markComplete(entry);
                LOG.info("completed {} of {}", entry.fileName, entry.table);
                return;
            } catch (FileAlreadyExistsException e) {
                // written meanwhile (its writer, another reader), from the same bytes
            } catch (FileNotFoundException e) {
                // its writer completed it and deleted the temporary file meanwhile, or the
                // table is gone: the next pass tells
                if (attempt >= 3 && !fs.exists(target)) {
                    LOG.warn("{} of {}: neither its temporary file nor the commit exists (the "
                        + "table was deleted?)", entry.fileName, entry.table);
                    return;
                }
            } catch (SQLException e) {
                if (attempt >= 3) {
                    throw new IOException("cannot mark " + entry.fileName + " of "
                        + entry.table + " complete: " + e.getMessage(), e);
                }
            } catch (IOException e) {
                if (attempt >= 3) {
                    throw e;
                }
            }
            if (attempt >= 5) {
                throw new IOException("cannot complete " + entry.fileName + " of " + entry.table);
            }
        }
    }

    // ------------------------------------------------------------------------------------------
    // Helpers
    // ------------------------------------------------------------------------------------------
    private Configuration conf(Configuration hadoopConf) {
        return hadoopConf.get(URL_KEY) != null ? hadoopConf : initHadoopConf();
    }

    /** The fence set for `table` in the session (key: the table's path as Spark gives it). */
    static String fenceOf(Configuration conf, String table) {
        String exact = conf.get(FENCE_PREFIX + table);
        if (exact != null) {
            return exact;
        }
        for (Map.Entry<String, String> e : conf.getPropsWithPrefix(FENCE_PREFIX).entrySet()) {
            try {
                if (stripUserInfo(new Path(e.getKey())).toString().equals(table)) {
                    return e.getValue();
                }
            } catch (IllegalArgumentException ignored) {
                // not a path
            }
        }
        return null;
    }

    private static byte[] bytes(Iterator<String> actions) {
        StringBuilder text = new StringBuilder();
        while (actions.hasNext()) {
            text.append(actions.next()).append('\n');
        }
        return text.toString().getBytes(StandardCharsets.UTF_8);
    }

    /**
     * `content` to `path`. With `overwrite` (a temporary file, or N.json once its entry holds
     * these bytes) S3A skips its probes of what is there (`fs.s3a.create.performance`): one PUT.
     */
    private static void put(FileSystem fs, Path path, byte[] content, boolean overwrite)
            throws IOException {
        try (OutputStream out = overwrite
                ? (OutputStream) fs.createFile(path).overwrite(true).recursive()
                    .opt("fs.s3a.create.performance", true).build()
                : fs.create(path, false)) {
            out.write(content);
        } catch (org.apache.hadoop.fs.FileAlreadyExistsException e) {
            throw new FileAlreadyExistsException(path.toString());
        }
    }

    private static void deleteQuietly(FileSystem fs, Path path) {
        try {
            fs.delete(path, false);
        } catch (Throwable e) {
            LOG.debug("could not delete {}: {}", path, e.toString());
        }
    }

    private static Path tablePath(Path deltaFile) {
        return deltaFile.getParent().getParent();
    }

    static Path stripUserInfo(Path path) {
        URI uri = path.toUri();
        try {
            return new Path(new URI(uri.getScheme(), null, uri.getHost(), uri.getPort(),
                uri.getPath(), uri.getQuery(), uri.getFragment()));
        } catch (URISyntaxException e) {
            throw new IllegalArgumentException(e);
        }
    }

    /** An entry of {@code lakehouse_delta_commits}. */
    static final class Entry {
        final String table;
        final String fileName;
        final String temp; // relative to the table's _delta_log
        final boolean complete;

        Entry(String table, String fileName, String temp, boolean complete) {
            this.table = table;
            this.fileName = fileName;
            this.temp = temp;
            this.complete = complete;
        }
    }

    /** One lock of a fence: its key, its holder's backend pid and start (microseconds). */
    static final class Token {
        final long key;
        final int pid;
        final long startMicros;

        Token(long key, int pid, long startMicros) {
            this.key = key;
            this.pid = pid;
            this.startMicros = startMicros;
        }

        int hi() {
            return (int) (key >>> 32);
        }

        int lo() {
            return (int) key;
        }

        static List<Token> parseAll(String text) {
            List<Token> out = new ArrayList<>();
            if (text == null || text.isBlank()) {
                return out;
            }
            for (String part : text.split(",")) {
                String[] f = part.trim().split(":");
                if (f.length != 3) {
                    throw new IllegalArgumentException("a writer fence is key:pid:start, not "
                        + part.trim());
                }
                out.add(new Token(Long.parseLong(f[0]), Integer.parseInt(f[1]),
                    Long.parseLong(f[2])));
            }
            // One order for every writer: two commits never wait on each other's locks.
            out.sort(Comparator.comparingLong((Token t) -> t.key));
            return out;
        }
    }

    /** The lock server: a few pooled connections per URL and user. */
    static final class Db {
        private static final Map<String, Db> ALL = new ConcurrentHashMap<>();
        private final String url;
        private final Properties props = new Properties();
        private final ConcurrentLinkedDeque<Connection> idle = new ConcurrentLinkedDeque<>();
        private volatile boolean created;

        private Db(String url, String user, String password) {
            this.url = url;
            if (user != null) {
                props.setProperty("user", user);
            }
            if (password != null) {
                props.setProperty("password", password);
            }
            props.setProperty("ApplicationName", "delta commit log (lakehouse)");
            props.setProperty("connectTimeout", "10");
            props.setProperty("tcpKeepAlive", "true");
        }

        static Db of(Configuration conf) throws SQLException {
            String url = conf.get(URL_KEY);
            if (url == null) {
                throw new SQLException("the lock server is not configured (" + URL_KEY
                    + " unset)");
            }
            String user = conf.get(USER_KEY);
            String password = conf.get(PASSWORD_KEY);
            String id = url + "\u0000" + user + "\u0000"
                + (password == null ? 0 : password.hashCode());
            return ALL.computeIfAbsent(id, k -> new Db(url, user, password));
        }

        private Connection open() throws SQLException {
            Connection c = new org.postgresql.Driver().connect(url, props);
            if (c == null) {
                throw new SQLException("not a PostgreSQL JDBC URL: " + URL_KEY);
            }
            if (!created) {
                // Only when missing: even with IF NOT EXISTS, CREATE INDEX would wait for (and,
                // queued, hold up) the commit transactions in flight.
                try (Statement s = c.createStatement();
                     ResultSet rs = s.executeQuery("SELECT to_regclass('" + TABLE + "') IS NULL "
                         + "OR to_regclass('" + TABLE + "_incomplete') IS NULL")) {
                    rs.next();
                    if (rs.getBoolean(1)) {
                        s.execute(DDL);
                        s.execute(INDEX);
                    }
                } catch (SQLException e) {
                    // created at the same moment by another driver: fine
                    if (!"23505".equals(e.getSQLState()) && !"42P07".equals(e.getSQLState())) {
                        c.close();
                        throw e;
                    }
                }
                created = true;
            }
            return c;
        }

        private interface Work<T> {
            T run(Connection c) throws SQLException, IOException;
        }

        /** `work` on a pooled connection; one retry on a fresh one for reads. */
        private <T> T with(Work<T> work, boolean retry) throws SQLException, IOException {
            Connection c = idle.pollFirst();
            boolean pooled = c != null;
            if (c == null) {
                c = open();
            }
            try {
                T out = work.run(c);
                idle.offerFirst(c);
                return out;
            } catch (SQLException e) {
                closeQuietly(c);
                if (retry && pooled && isConnectionError(e)) {
                    return with(work, false);
                }
                throw e;
            } catch (IOException | RuntimeException e) {
                closeQuietly(c);
                throw e;
            }
        }

        private static boolean isConnectionError(SQLException e) {
            String state = e.getSQLState();
            return state == null || state.startsWith("08") || state.startsWith("57P");
        }

        private static void closeQuietly(Connection c) {
            try {
                c.close();
            } catch (SQLException ignored) {
                // gone already
            }
        }

        private static Entry entry(ResultSet rs) throws SQLException {
            return new Entry(rs.getString(1), rs.getString(2), rs.getString(3), rs.getBoolean(4));
        }

        /** The entries of `table` named `names` (nulls skipped), by file name. */
        Map<String, Entry> get(String table, String... names) throws SQLException, IOException {
            return with(c -> {
                Map<String, Entry> out = new java.util.HashMap<>();
                try (PreparedStatement s = c.prepareStatement("SELECT table_path, file_name, "
                        + "temp_path, complete FROM " + TABLE
                        + " WHERE table_path = ? AND file_name = ANY(?)")) {
                    s.setString(1, table);
                    s.setArray(2, c.createArrayOf("text", java.util.Arrays.stream(names)
                        .filter(java.util.Objects::nonNull).toArray()));
                    try (ResultSet rs = s.executeQuery()) {
                        while (rs.next()) {
                            Entry e = entry(rs);
                            out.put(e.fileName, e);
                        }
                    }
                }
                return out;
            }, true);
        }

        Entry latest(String table) throws SQLException {
            try {
                return with(c -> {
                    try (PreparedStatement s = c.prepareStatement("SELECT table_path, "
                            + "file_name, temp_path, complete FROM " + TABLE
                            + " WHERE table_path = ? ORDER BY file_name DESC LIMIT 1")) {
                        s.setString(1, table);
                        try (ResultSet rs = s.executeQuery()) {
                            return rs.next() ? entry(rs) : null;
                        }
                    }
                }, true);
            } catch (IOException e) {
                throw new SQLException(e);
            }
        }

        /**
         * The commit point: in one transaction, each fence lock's shared transaction lock, then
         * the check that each advisory lock is held by its holder's backend, then the insert.
         * `stale`: the temporary path of an old table's entry 0 to clear first (a creation).
         */
        void insert(Entry entry, List<Token> fence, String fenceText, String stale)
                throws SQLException, IOException {
            try {
                with(c -> {
                    c.setAutoCommit(false);
                    try {
                        insertIn(c, entry, fence, fenceText, stale);
                        c.commit();
                    } catch (SQLException | IOException | RuntimeException e) {
                        try {
                            c.rollback();
                        } catch (SQLException ignored) {
                            // the connection is gone: so is the transaction
                        }
                        throw e;
                    } finally {
                        try {
                            c.setAutoCommit(true);
                        } catch (SQLException ignored) {
                            // closed by the caller
                        }
                    }
                    return null;
                }, false);
            } catch (SQLException e) {
                if ("23505".equals(e.getSQLState())) {
                    throw new FileAlreadyExistsException(entry.table + "/_delta_log/"
                        + entry.fileName);
                }
                if (isConnectionError(e)) {
                    // The outcome of a COMMIT whose connection broke: the entry says.
                    Entry found;
                    try {
                        found = get(entry.table, entry.fileName).get(entry.fileName);
                    } catch (SQLException again) {
                        throw new IOException(LOST + ": commit " + entry.fileName + " of "
                            + entry.table + ": its outcome is unknown (the lock server is "
                            + "unreachable: " + again.getMessage() + ")", e);
                    }
                    if (found != null && found.temp.equals(entry.temp)) {
                        return; // it landed
                    }
                    if ("57P01".equals(e.getSQLState())) {
                        throw new Refused(LOST + ": commit " + entry.fileName + " of "
                            + entry.table + " not made: the lock server ended its transaction "
                            + "(a new holder took the lock over)", e);
                    }
                }
                throw e;
            }
        }

        private static void insertIn(Connection c, Entry entry, List<Token> fence,
                                     String fenceText, String stale)
                throws SQLException, IOException {
            for (Token t : fence) {
                try (PreparedStatement s = c.prepareStatement(
                        "SELECT pg_advisory_xact_lock_shared(?, ?)")) {
                    s.setInt(1, t.hi());
                    s.setInt(2, t.lo());
                    s.execute();
                }
            }
            for (Token t : fence) {
                try (PreparedStatement s = c.prepareStatement("SELECT count(*) FROM pg_locks l "
                        + "JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = "
                        + "'advisory' AND l.granted AND l.objsubid = 1 AND l.database = "
                        + "(SELECT oid FROM pg_database WHERE datname = current_database()) "
                        + "AND l.classid = ?::int8::oid AND l.objid = ?::int8::oid "
                        + "AND l.pid = ? AND (extract(epoch FROM a.backend_start) * 1000000)"
                        + "::int8 = ?")) {
                    s.setLong(1, t.key >>> 32);
                    s.setLong(2, t.key & 0xFFFFFFFFL);
                    s.setInt(3, t.pid);
                    s.setLong(4, t.startMicros);
                    try (ResultSet rs = s.executeQuery()) {
                        rs.next();
                        if (rs.getLong(1) == 0) {
                            throw new Refused(LOST + ": commit " + entry.fileName + " of "
                                + entry.table + " refused: the writer lock " + t.key
                                + " is no longer held by the session (pid " + t.pid
                                + ") that took it; not committing");
                        }
                    }
                }
            }
            if (stale != null) {
                try (PreparedStatement s = c.prepareStatement("DELETE FROM " + TABLE
                        + " WHERE table_path = ? AND EXISTS (SELECT 1 FROM " + TABLE
                        + " WHERE table_path = ? AND file_name = ? AND temp_path = ?)")) {
                    s.setString(1, entry.table);
                    s.setString(2, entry.table);
                    s.setString(3, entry.fileName);
                    s.setString(4, stale);
                    s.executeUpdate();
                }
            }
            try (PreparedStatement s = c.prepareStatement("INSERT INTO " + TABLE
                    + " (table_path, file_name, temp_path, complete, lock_keys, fence) "
                    + "VALUES (?, ?, ?, false, ?, ?)")) {
                s.setString(1, entry.table);
                s.setString(2, entry.fileName);
                s.setString(3, entry.temp);
                Long[] keys = fence.stream().map(t -> t.key).toArray(Long[]::new);
                Array array = c.createArrayOf("int8", keys);
                s.setArray(4, fence.isEmpty() ? null : array);
                s.setString(5, fenceText);
                s.executeUpdate();
            }
        }

        /** Mark `entry` complete (it expires a day later) and delete expired entries. */
        void markComplete(Entry entry) throws SQLException, IOException {
            long now = System.currentTimeMillis() / 1000;
            with(c -> {
                try (PreparedStatement s = c.prepareStatement("WITH done AS (UPDATE " + TABLE
                        + " SET complete = true, expire_time = ? WHERE table_path = ? AND "
                        + "file_name = ? AND NOT complete RETURNING 1), gone AS (DELETE FROM "
                        + TABLE + " WHERE table_path = ? AND complete AND expire_time < ? "
                        + "RETURNING 1) SELECT (SELECT count(*) FROM done), "
                        + "(SELECT count(*) FROM gone)")) {
                    s.setLong(1, now + RETENTION_S);
                    s.setString(2, entry.table);
                    s.setString(3, entry.fileName);
                    s.setString(4, entry.table);
                    s.setLong(5, now);
                    s.executeQuery().close();
                }
                return null;
            }, true);
        }
    }
}
