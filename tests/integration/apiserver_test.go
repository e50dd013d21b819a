package integration

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	uploadv1 "github.com/kubefill/kubefill-api/upload/v1beta1"

	"github.com/kubefill/kubefill/pkg/pki"
	"github.com/kubefill/kubefill/pkg/token"
	"github.com/kubefill/kubefill/tests/kit"
)

func grantRole(t *testing.T, e *aggEnv, ns, user string, rules ...rbacv1.PolicyRule) {
	t.Helper()
	ctx := context.Background()
	name := "grant-" + strings.ReplaceAll(user, ":", "-")
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Rules: rules}
	if err := e.client.Create(ctx, role); err != nil {
		t.Fatalf("creating role: %v", err)
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
	}
	if err := e.client.Create(ctx, rb); err != nil {
		t.Fatalf("creating role binding: %v", err)
	}
	// kube-apiserver's RBAC authorizer learns of the binding from its
	// informer, a moment later on a busy machine: wait until it judges by
	// it, so that the caller's next request as user is.
	if len(rules) == 0 || len(rules[0].Verbs) == 0 || len(rules[0].Resources) == 0 || len(rules[0].APIGroups) == 0 {
		return
	}
	r := rules[0]
	attrs := &authorizationv1.ResourceAttributes{Namespace: ns, Verb: r.Verbs[0], Group: r.APIGroups[0], Resource: r.Resources[0]}
	if attrs.Verb == "*" {
		attrs.Verb = "create"
	}
	if res, sub, ok := strings.Cut(attrs.Resource, "/"); ok {
		attrs.Resource, attrs.Subresource = res, sub
	}
	if len(r.ResourceNames) > 0 {
		attrs.Name = r.ResourceNames[0]
	}
	kit.Until(t, 30*time.Second, "kube-apiserver to authorise "+user+" by the new binding in "+ns, func() bool {
		review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: user, ResourceAttributes: attrs}}
		return e.client.Create(ctx, review) == nil && review.Status.Allowed
	})
}

func newClaim(ns, name string, annotations map[string]string) *corev1.PersistentVolumeClaim {
	return kit.PVC(ns, name, "1Gi", kit.Annotate(annotations))
}

type tokenCall struct {
	status int
	body   []byte
}

func (c tokenCall) status2() metav1.Status {
	var st metav1.Status
	_ = json.Unmarshal(c.body, &st)
	return st
}

// postToken posts an UploadTokenRequest as the aggregator would: with the
// given client certificate and identity headers.
func postToken(t *testing.T, rs *runningServer, cert *tls.Certificate, headers map[string][]string, ns, pvc string) tokenCall {
	t.Helper()
	body, _ := json.Marshal(uploadv1.UploadTokenRequest{
		TypeMeta:   metav1.TypeMeta{APIVersion: uploadv1.SchemeGroupVersion.String(), Kind: "UploadTokenRequest"},
		ObjectMeta: metav1.ObjectMeta{GenerateName: "token-for-virtctl-", Namespace: ns},
		Spec:       uploadv1.UploadTokenRequestSpec{PvcName: pvc},
	})
	url := fmt.Sprintf("https://%s/apis/upload.cdi.kubevirt.io/v1beta1/namespaces/%s/uploadtokenrequests", rs.addr, ns)
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, vs := range headers {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	start := time.Now()
	resp, err := rs.httpClient(t, cert).Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	t.Logf("POST uploadtokenrequests as %v -> %d in %s", headers["X-Remote-User"], resp.StatusCode, time.Since(start).Round(time.Microsecond))
	return tokenCall{status: resp.StatusCode, body: data}
}

// TestAggregatedAPIServer shares one control plane configured for aggregation
// (front-proxy CA, Node,RBAC) between the token endpoint, webhook and
// aggregator tests, to save two control-plane starts.
func TestAggregatedAPIServer(t *testing.T) {
	t.Parallel()
	e := startAggEnv(t)
	t.Run("upload token endpoint", func(t *testing.T) { testUploadTokens(t, e) })
	t.Run("admission webhooks", func(t *testing.T) { testWebhooks(t, e) })
	t.Run("through kube-apiserver's aggregator", func(t *testing.T) { testThroughAggregator(t, e) })
}

func testUploadTokens(t *testing.T, e *aggEnv) {
	rs := e.startServer(t, false)
	ctx := context.Background()

	ns := e.namespace(t, "upload-")
	for _, pvc := range []*corev1.PersistentVolumeClaim{
		newClaim(ns, "target", map[string]string{cdiv1.AnnUploadRequest: ""}),
		newClaim(ns, "plain", nil),
	} {
		if err := e.client.Create(ctx, pvc); err != nil {
			t.Fatal(err)
		}
	}
	grantRole(t, e, ns, "alice", rbacv1.PolicyRule{APIGroups: []string{uploadv1.GroupName}, Resources: []string{"uploadtokenrequests"}, Verbs: []string{"create"}})

	proxy := &e.proxyCert
	as := func(user string, groups ...string) map[string][]string {
		return map[string][]string{"X-Remote-User": {user}, "X-Remote-Group": append(groups, "system:authenticated")}
	}

	t.Run("front proxy with an allowed user gets a valid token", func(t *testing.T) {
		res := postToken(t, rs, proxy, as("alice"), ns, "target")
		if res.status != http.StatusCreated {
			t.Fatalf("status %d: %s", res.status, res.body)
		}
		var utr uploadv1.UploadTokenRequest
		if err := json.Unmarshal(res.body, &utr); err != nil {
			t.Fatal(err)
		}
		if utr.Kind != "UploadTokenRequest" || utr.APIVersion != "upload.cdi.kubevirt.io/v1beta1" || !strings.HasPrefix(utr.Name, "token-for-virtctl-") || utr.Status.Token == "" {
			t.Fatalf("response object: %+v", utr)
		}
		ks := rs.signingKeys(t, e.client)
		p, err := token.NewValidator(token.UploadTokenIssuer, ks.Current, 10*time.Second).Validate(utr.Status.Token)
		if err != nil {
			t.Fatalf("token does not validate with the public key from the Secret: %v", err)
		}
		if err := token.CheckUpload(p, ns, "target"); err != nil {
			t.Fatal(err)
		}
		if p.Resource.Version != "v1" {
			t.Fatalf("resource %+v", p.Resource)
		}
	})

	t.Run("front proxy with a user without RBAC gets 403 with the reason", func(t *testing.T) {
		res := postToken(t, rs, proxy, as("bob"), ns, "target")
		st := res.status2()
		if res.status != http.StatusForbidden || st.Reason != metav1.StatusReasonForbidden ||
			!strings.Contains(st.Message, `User "bob" cannot create resource "uploadtokenrequests" in API group "upload.cdi.kubevirt.io" in the namespace "`+ns+`"`) {
			t.Fatalf("status %d: %s", res.status, res.body)
		}
	})

	t.Run("identity headers without a client certificate get 401", func(t *testing.T) {
		res := postToken(t, rs, nil, as("alice", "system:masters"), ns, "target")
		if res.status != http.StatusUnauthorized || res.status2().Reason != metav1.StatusReasonUnauthorized {
			t.Fatalf("status %d: %s", res.status, res.body)
		}
	})

	t.Run("a front-proxy CA certificate with a CN not allowed gets 401", func(t *testing.T) {
		evil, _, _ := e.frontProxy.ClientCert(t, "not-the-front-proxy")
		if res := postToken(t, rs, &evil, as("alice"), ns, "target"); res.status != http.StatusUnauthorized {
			t.Fatalf("status %d: %s", res.status, res.body)
		}
	})

	t.Run("a self-made CA with the allowed CN gets 401", func(t *testing.T) {
		forged, _, _ := kit.TestCA(t, "forged-ca").ClientCert(t, frontProxyName)
		if res := postToken(t, rs, &forged, as("alice"), ns, "target"); res.status != http.StatusUnauthorized {
			t.Fatalf("status %d: %s", res.status, res.body)
		}
	})

	t.Run("the front proxy without a user header gets 401", func(t *testing.T) {
		if res := postToken(t, rs, proxy, nil, ns, "target"); res.status != http.StatusUnauthorized {
			t.Fatalf("status %d: %s", res.status, res.body)
		}
	})

	t.Run("a client-CA certificate authenticates as its CN and its headers are ignored", func(t *testing.T) {
		cfg := e.userConfig(t, "alice")
		pair, err := tls.X509KeyPair(cfg.CertData, cfg.KeyData)
		if err != nil {
			t.Fatal(err)
		}
		if res := postToken(t, rs, &pair, nil, ns, "target"); res.status != http.StatusCreated {
			t.Fatalf("alice by client certificate: status %d: %s", res.status, res.body)
		}
		cfgBob := e.userConfig(t, "bob")
		pairBob, err := tls.X509KeyPair(cfgBob.CertData, cfgBob.KeyData)
		if err != nil {
			t.Fatal(err)
		}
		// bob's own certificate claiming to be alice through headers stays bob.
		res := postToken(t, rs, &pairBob, as("alice"), ns, "target")
		if res.status != http.StatusForbidden || !strings.Contains(res.status2().Message, `User "bob"`) {
			t.Fatalf("bob with spoofed headers: status %d: %s", res.status, res.body)
		}
	})

	t.Run("a claim that is not an upload target gets 400", func(t *testing.T) {
		res := postToken(t, rs, proxy, as("alice"), ns, "plain")
		if res.status != http.StatusBadRequest || !strings.Contains(res.status2().Message, "is not an upload target") {
			t.Fatalf("status %d: %s", res.status, res.body)
		}
		res = postToken(t, rs, proxy, as("alice"), ns, "missing")
		if res.status != http.StatusBadRequest || !strings.Contains(res.status2().Message, "not found") {
			t.Fatalf("status %d: %s", res.status, res.body)
		}
		res = postToken(t, rs, proxy, as("alice"), ns, "")
		if res.status != http.StatusBadRequest || !strings.Contains(res.status2().Message, "spec.pvcName is required") {
			t.Fatalf("status %d: %s", res.status, res.body)
		}
	})

	t.Run("discovery, openapi and health", func(t *testing.T) {
		hc := rs.httpClient(t, nil)
		get := func(path string, into any) {
			t.Helper()
			resp, err := hc.Get("https://" + rs.addr + path)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			data, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("GET %s: %d %s", path, resp.StatusCode, data)
			}
			if into != nil {
				if err := json.Unmarshal(data, into); err != nil {
					t.Fatalf("GET %s: %v in %s", path, err, data)
				}
			}
		}
		var groups metav1.APIGroupList
		get("/apis", &groups)
		if len(groups.Groups) != 1 || groups.Groups[0].Name != "upload.cdi.kubevirt.io" || groups.Groups[0].PreferredVersion.GroupVersion != "upload.cdi.kubevirt.io/v1beta1" {
			t.Fatalf("/apis: %+v", groups)
		}
		var group metav1.APIGroup
		get("/apis/upload.cdi.kubevirt.io", &group)
		if group.Kind != "APIGroup" || group.Versions[0].Version != "v1beta1" {
			t.Fatalf("group: %+v", group)
		}
		var res metav1.APIResourceList
		get("/apis/upload.cdi.kubevirt.io/v1beta1", &res)
		if res.Kind != "APIResourceList" || len(res.APIResources) != 1 || res.APIResources[0].Name != "uploadtokenrequests" ||
			!res.APIResources[0].Namespaced || res.APIResources[0].Kind != "UploadTokenRequest" || res.APIResources[0].Verbs[0] != "create" {
			t.Fatalf("resources: %+v", res)
		}
		var v2 map[string]any
		get("/openapi/v2", &v2)
		if v2["swagger"] != "2.0" {
			t.Fatalf("openapi v2: %v", v2["swagger"])
		}
		var v3 struct {
			Paths map[string]struct {
				ServerRelativeURL string `json:"serverRelativeURL"`
			} `json:"paths"`
		}
		get("/openapi/v3", &v3)
		gv, ok := v3.Paths["apis/upload.cdi.kubevirt.io/v1beta1"]
		if !ok {
			t.Fatalf("openapi v3 index: %+v", v3)
		}
		var v3doc map[string]any
		get(gv.ServerRelativeURL, &v3doc)
		if v3doc["openapi"] != "3.0.0" {
			t.Fatalf("openapi v3 doc: %v", v3doc["openapi"])
		}
		get("/healthz", nil)
		get("/readyz", nil)
	})

	t.Run("the serving certificate is reloaded when its files change", func(t *testing.T) {
		serial := func() string {
			conn, err := tls.Dial("tcp", rs.addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // only reading the presented certificate
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
		}
		before := serial()
		sc, err := pki.GenerateServingCert("kubefill-api", []string{"127.0.0.1"}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		// Write key first then cert, as a Secret volume update swaps both.
		if err := os.WriteFile(rs.keyFile, sc.KeyPEM, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(rs.certFile, sc.CertPEM, 0o600); err != nil {
			t.Fatal(err)
		}
		took := kit.Eventually(t, 10*time.Second, 200*time.Millisecond, "the new certificate to be served", func() (bool, string, error) {
			return serial() != before, "", nil
		})
		t.Logf("new serving certificate picked up after %s", took.Round(time.Millisecond))
		rs.caPEM = sc.CAPEM
		if res := postToken(t, rs, proxy, as("alice"), ns, "target"); res.status != http.StatusCreated {
			t.Fatalf("after reload: status %d: %s", res.status, res.body)
		}
	})
}
