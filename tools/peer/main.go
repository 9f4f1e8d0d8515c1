// Command peer does to the Kubernetes API what Spark's ExecutorPodsAllocator does inside a
// driver, so podalloc can be measured against it on the same server: a watch on the app's
// executor pods (ExecutorPodsWatchSnapshotSource: namespace, spark-app-selector and
// spark-role=executor, re-established when the server closes it), a full list of them every
// --poll-interval (ExecutorPodsPollingSnapshotSource, default 30 s as
// spark.kubernetes.executor.apiPollingInterval, with spark-exec-inactive!=true), and Spark
// 3.0's batch allocation: while no requested pod is pending or unseen and running < target,
// create min(batch size, target - running) pods with fresh ids every batch delay; above the
// target, delete the newest executors (what the driver's dynamic allocation does through the
// scheduler backend). The target is read from --target-file every second.
//
// It prints one JSON line per create or delete and a summary on SIGTERM.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

type state struct {
	mu       sync.Mutex
	pods     map[string]*corev1.Pod // by name, from the watch and the polls
	unseen   map[string]time.Time   // created, not yet seen
	nextID   int
	requests map[string]int
}

func (s *state) count(verb string) {
	s.mu.Lock()
	s.requests[verb]++
	s.mu.Unlock()
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig file")
	ns := flag.String("namespace", "default", "namespace")
	app := flag.String("app-id", "peer", "spark-app-selector of the executors")
	image := flag.String("image", "img", "executor image")
	targetFile := flag.String("target-file", "", "file holding the target (a whole number), read every second")
	batch := flag.Int("batch-size", 5, "spark.kubernetes.allocation.batch.size")
	delay := flag.Duration("batch-delay", time.Second, "spark.kubernetes.allocation.batch.delay")
	poll := flag.Duration("poll-interval", 30*time.Second, "spark.kubernetes.executor.apiPollingInterval")
	flag.Parse()

	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, "peer:", err)
		os.Exit(2)
	}
	cfg.QPS, cfg.Burst = 1000, 1000 // Spark's fabric8 client does not rate-limit either
	client := kubernetes.NewForConfigOrDie(cfg)
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()

	sel := fmt.Sprintf("spark-app-selector=%s,spark-role=executor", *app)
	s := &state{pods: map[string]*corev1.Pod{}, unseen: map[string]time.Time{}, nextID: 1, requests: map[string]int{}}
	pods := client.CoreV1().Pods(*ns)

	go watchLoop(ctx, s, pods, sel)
	go func() {
		t := time.NewTicker(*poll)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				s.count("list")
				list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: sel + ",spark-exec-inactive!=true"})
				if err != nil {
					continue
				}
				s.mu.Lock()
				s.pods = map[string]*corev1.Pod{}
				for i := range list.Items {
					s.see(&list.Items[i])
				}
				s.mu.Unlock()
			}
		}
	}()

	t := time.NewTicker(*delay)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			s.mu.Lock()
			out, _ := json.Marshal(map[string]any{"summary": s.requests})
			s.mu.Unlock()
			fmt.Println(string(out))
			return
		case <-t.C:
			allocate(ctx, s, pods, *app, *image, readTarget(*targetFile), *batch)
		}
	}
}

// see records a pod seen in a snapshot; the caller holds the lock.
func (s *state) see(p *corev1.Pod) {
	s.pods[p.Name] = p
	delete(s.unseen, p.Name)
	if id, err := strconv.Atoi(p.Labels["spark-exec-id"]); err == nil && id >= s.nextID {
		s.nextID = id + 1
	}
}

func watchLoop(ctx context.Context, s *state, pods interface {
	Watch(context.Context, metav1.ListOptions) (watch.Interface, error)
}, sel string) {
	for ctx.Err() == nil {
		s.count("watch")
		w, err := pods.Watch(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			time.Sleep(time.Second)
			continue
		}
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			s.mu.Lock()
			if ev.Type == watch.Deleted {
				delete(s.pods, p.Name)
			} else {
				s.see(p)
			}
			s.mu.Unlock()
		}
	}
}

func readTarget(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

func active(p *corev1.Pod) bool {
	return p.DeletionTimestamp == nil && (p.Status.Phase == corev1.PodPending || p.Status.Phase == corev1.PodRunning)
}

// allocate is one round of Spark 3.0's rules (seed 004), as the peer needs them.
func allocate(ctx context.Context, s *state, pods interface {
	Create(context.Context, *corev1.Pod, metav1.CreateOptions) (*corev1.Pod, error)
	Delete(context.Context, string, metav1.DeleteOptions) error
}, app, image string, target, batch int) {
	s.mu.Lock()
	running, pending := 0, 0
	var live []*corev1.Pod
	for _, p := range s.pods {
		if !active(p) {
			continue
		}
		live = append(live, p)
		if p.Status.Phase == corev1.PodRunning {
			running++
		} else {
			pending++
		}
	}
	for name, at := range s.unseen {
		if time.Since(at) > time.Minute {
			delete(s.unseen, name)
		}
	}
	unseen := len(s.unseen)
	var create []int
	if unseen == 0 && pending == 0 && running < target {
		n := target - running
		if n > batch {
			n = batch
		}
		for i := 0; i < n; i++ {
			create = append(create, s.nextID)
			s.unseen[fmt.Sprintf("%s-exec-%d", app, s.nextID)] = time.Now()
			s.nextID++
		}
	}
	var del []string
	if len(live) > target {
		sort.Slice(live, func(i, j int) bool {
			a, _ := strconv.Atoi(live[i].Labels["spark-exec-id"])
			b, _ := strconv.Atoi(live[j].Labels["spark-exec-id"])
			return a > b
		})
		for _, p := range live[:len(live)-target] {
			del = append(del, p.Name)
		}
	}
	s.mu.Unlock()
	for _, name := range del {
		s.count("delete")
		if err := pods.Delete(ctx, name, metav1.DeleteOptions{}); err == nil {
			fmt.Printf("{\"delete\":%q,\"at\":%d}\n", name, time.Now().UnixMilli())
		}
	}
	for _, id := range create {
		s.count("create")
		name := fmt.Sprintf("%s-exec-%d", app, id)
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
				"spark-app-selector": app, "spark-role": "executor", "spark-exec-id": strconv.Itoa(id)}},
			Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{Name: "executor", Image: image}}},
		}
		if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err == nil {
			fmt.Printf("{\"create\":%q,\"at\":%d}\n", name, time.Now().UnixMilli())
		}
	}
}
